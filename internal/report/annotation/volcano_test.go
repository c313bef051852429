package annotation_test

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/annotation"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// volcanoPlugin writes volcano.sh/gpu-unhealthy-ids the way Volcano's device plugin does: it
// deletes the key when it starts, and on each XID writes its own list of the GPUs it has seen
// fail (never removing one, never reading what is there).
type volcanoPlugin struct {
	client *fake.Clientset
	node   string
	failed string
}

func (v *volcanoPlugin) patch(t *testing.T, value any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{gpuhealthv1.UnhealthyIDsKey: value}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.client.CoreV1().Nodes().Patch(context.Background(), v.node, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (v *volcanoPlugin) start(t *testing.T) { v.failed = ""; v.patch(t, nil) }

func (v *volcanoPlugin) xid(t *testing.T, list string) { v.failed = list; v.patch(t, list) }

// gpus returns a snapshot of 4 GPUs where the given indexes are Unhealthy.
func gpus(unhealthy ...int) health.Snapshot {
	var devs []health.DeviceStatus
	for i := range 4 {
		d := health.DeviceStatus{Device: health.Device{UUID: "GPU-" + string(rune('a'+i)), Index: i}, Health: health.Healthy}
		for _, u := range unhealthy {
			if u == i {
				d.Health = health.Unhealthy
				d.Conditions = []health.Condition{{Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, Reason: "XID79"}}
			}
		}
		devs = append(devs, d)
	}
	return health.Snapshot{Devices: devs}
}

func TestVolcanoAnnotationBesideVolcanoDevicePlugin(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{"other.io/keep": "yes"}}}
	client := fake.NewClientset(node)
	s := annotation.New(adapt.Clientset(client), "n1", annotation.Options{})
	volcano := &volcanoPlugin{client: client, node: "n1"}

	steps := []struct {
		name       string
		act        func(t *testing.T)
		ours       []int
		wantWrites int
		want       string // the key's value; "" = absent
	}{
		// Writes count the health annotation too: a step where gpuhealth's view changes writes once.
		{"Volcano's plugin starts: deletes the key; gpuhealth writes its health annotation", volcano.start, nil, 1, ""},
		{"gpuhealth finds GPU 0 Unhealthy", nil, []int{0}, 1, "0"},
		{"Volcano's plugin sees an XID on GPU 2: replaces the list with its own", func(t *testing.T) { volcano.xid(t, "2") }, []int{0}, 1, "0,2"},
		{"nothing changes: no write", nil, []int{0}, 0, "0,2"},
		{"gpuhealth's GPU 0 recovers: only its own index goes", nil, nil, 1, "2"},
		{"gpuhealth finds GPU 2 Unhealthy too", nil, []int{2}, 1, "2"},
		{"gpuhealth's GPU 2 recovers: Volcano's claim on it stays", nil, nil, 1, "2"},
		{"gpuhealth finds GPU 3 Unhealthy", nil, []int{3}, 1, "2,3"},
		{"Volcano's plugin restarts: deletes the key; gpuhealth writes its own back once", volcano.start, []int{3}, 1, "3"},
		{"an operator rewrites the key by hand with garbage: kept verbatim", func(t *testing.T) { volcano.patch(t, "1,x y,3") }, []int{3}, 1, "1,3,x y"},
		// The operator's value named 3: it counts as the operator's until the operator removes it.
		{"gpuhealth's GPU 3 recovers: the hand-written entries stay", nil, nil, 1, "1,3,x y"},
		{"the operator clears the key; all healthy: key absent", func(t *testing.T) { volcano.patch(t, nil) }, nil, 1, ""},
	}
	for _, st := range steps {
		if st.act != nil {
			st.act(t)
		}
		writes, err := s.Sync(ctx, gpus(st.ours...))
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		value, present := got.Annotations[gpuhealthv1.UnhealthyIDsKey]
		if value != st.want || present != (st.want != "") {
			t.Errorf("%s: %s = %q (present %v), want %q", st.name, gpuhealthv1.UnhealthyIDsKey, value, present, st.want)
		}
		if writes != st.wantWrites {
			t.Errorf("%s: %d writes, want %d", st.name, writes, st.wantWrites)
		}
		if _, hasState := got.Annotations[gpuhealthv1.VolcanoStateKey]; !hasState {
			t.Errorf("%s: the state annotation is missing", st.name)
		}
		if got.Annotations["other.io/keep"] != "yes" {
			t.Fatalf("%s: a foreign annotation was clobbered", st.name)
		}
		// A second sync of the same state never writes: no fight with ourselves.
		if again, err := s.Sync(ctx, gpus(st.ours...)); err != nil || again != 0 {
			t.Errorf("%s: second sync wrote %d times (err %v)", st.name, again, err)
		}
	}
}

func TestVolcanoAnnotationWithoutState(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		health bool
		want   string
	}{
		// An earlier gpuhealth owned the key outright: what it left is stale now that GPU 0 and
		// GPU 2 are healthy (the start-up reconcile).
		{"gpuhealth ran here before: its stale entries go", true, ""},
		// gpuhealth never ran on the node: Volcano's plugin wrote the list.
		{"gpuhealth never ran here: every entry is another writer's", false, "0,2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,2"}
			if tc.health {
				ann[gpuhealthv1.HealthKey] = "{}"
			}
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: ann}})
			if _, err := annotation.New(adapt.Clientset(client), "n1", annotation.Options{}).Sync(ctx, gpus()); err != nil {
				t.Fatal(err)
			}
			got, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if v := got.Annotations[gpuhealthv1.UnhealthyIDsKey]; v != tc.want {
				t.Errorf("%s = %q, want %q", gpuhealthv1.UnhealthyIDsKey, v, tc.want)
			}
		})
	}
}

func TestVolcanoAnnotationGarbledStateKeepsEverything(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{
		gpuhealthv1.UnhealthyIDsKey: "1,2",
		gpuhealthv1.VolcanoStateKey: "][",
	}}})
	s := annotation.New(adapt.Clientset(client), "n1", annotation.Options{})
	for range 3 {
		if _, err := s.Sync(ctx, gpus(3)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := got.Annotations[gpuhealthv1.UnhealthyIDsKey]; v != "1,2,3" {
		t.Errorf("%s = %q, want 1,2,3", gpuhealthv1.UnhealthyIDsKey, v)
	}
	var state map[string]string
	if err := json.Unmarshal([]byte(got.Annotations[gpuhealthv1.VolcanoStateKey]), &state); err != nil {
		t.Errorf("state not repaired: %v", err)
	}
}
