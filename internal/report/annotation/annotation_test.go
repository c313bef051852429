package annotation_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/annotation"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func snap(health0, health3 health.Severity) health.Snapshot {
	var devs []health.DeviceStatus
	for i := range 4 {
		h := health.Healthy
		switch i {
		case 0:
			h = health0
		case 3:
			h = health3
		}
		d := health.DeviceStatus{Device: health.Device{UUID: "GPU-" + string(rune('a'+i)), Index: i}, Health: h}
		if h != health.Healthy {
			d.Conditions = []health.Condition{{Type: health.ConditionXID, Code: 79, Severity: h, Reason: "XID79"}}
		}
		devs = append(devs, d)
	}
	return health.Snapshot{Devices: devs}
}

func TestDesired(t *testing.T) {
	for _, tc := range []struct {
		name    string
		snap    health.Snapshot
		wantIDs string
	}{
		{"all healthy: no annotation", snap(health.Healthy, health.Healthy), ""},
		{"ascending, no spaces", snap(health.Unhealthy, health.Unhealthy), "0,3"},
		{"degraded GPUs stay schedulable", snap(health.Degraded, health.Unhealthy), "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, js, err := annotation.Desired(tc.snap)
			if err != nil {
				t.Fatal(err)
			}
			if ids != tc.wantIDs {
				t.Errorf("unhealthy ids = %q, want %q", ids, tc.wantIDs)
			}
			var m map[string]gpuhealthv1.GPUSummary
			if err := json.Unmarshal([]byte(js), &m); err != nil {
				t.Fatalf("health annotation is not JSON: %v", err)
			}
			if len(m) != 4 || m["GPU-a"].Index != 0 {
				t.Errorf("health annotation = %s, want every GPU keyed by UUID", js)
			}
		})
	}
}

func TestSyncWritesOnlyOnChangeAndKeepsForeignAnnotations(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{"other.io/keep": "yes"}}}
	client := fake.NewClientset(node)
	s := annotation.New(adapt.Clientset(client), "n1", annotation.Options{})

	steps := []struct {
		name       string
		snap       health.Snapshot
		wantWrites int
		wantIDs    string
	}{
		{"fault appears", snap(health.Unhealthy, health.Healthy), 1, "0"},
		{"same state again", snap(health.Unhealthy, health.Healthy), 0, "0"},
		{"second fault", snap(health.Unhealthy, health.Unhealthy), 1, "0,3"},
		{"all recovered: ids removed", snap(health.Healthy, health.Healthy), 1, ""},
		{"still healthy", snap(health.Healthy, health.Healthy), 0, ""},
	}
	for _, st := range steps {
		writes, err := s.Sync(ctx, st.snap)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if writes != st.wantWrites {
			t.Errorf("%s: %d writes, want %d", st.name, writes, st.wantWrites)
		}
		got, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids, present := got.Annotations[gpuhealthv1.UnhealthyIDsKey]
		if ids != st.wantIDs || present != (st.wantIDs != "") {
			t.Errorf("%s: %s = %q (present %v), want %q", st.name, gpuhealthv1.UnhealthyIDsKey, ids, present, st.wantIDs)
		}
		if got.Annotations["other.io/keep"] != "yes" {
			t.Fatalf("%s: a foreign annotation was clobbered: %v", st.name, got.Annotations)
		}
		if _, ok := got.Annotations[gpuhealthv1.HealthKey]; !ok {
			t.Errorf("%s: %s missing", st.name, gpuhealthv1.HealthKey)
		}
	}
}

func TestSyncFailsCleanlyWithoutTheNode(t *testing.T) {
	s := annotation.New(adapt.Clientset(fake.NewClientset()), "missing", annotation.Options{})
	if _, err := s.Sync(context.Background(), snap(health.Unhealthy, health.Healthy)); err == nil {
		t.Fatal("Sync succeeded for a node that does not exist")
	}
}

// TestNoHeartbeatOnTheNode: the heartbeat is a Lease now; the syncer writes the Node only when a
// value changed, and leaves an earlier release's heartbeat annotation alone.
func TestNoHeartbeatOnTheNode(t *testing.T) {
	ctx := context.Background()
	old := gpuhealthv1.FormatHeartbeat(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{gpuhealthv1.HeartbeatKey: old}}})
	s := annotation.New(adapt.Clientset(client), "n1", annotation.Options{})
	for i, want := range []int{1, 0, 0} {
		if n, err := s.Sync(ctx, snap(health.Healthy, health.Healthy)); err != nil || n != want {
			t.Fatalf("Sync %d = %d, %v; want %d writes", i, n, err, want)
		}
	}
	n, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Annotations[gpuhealthv1.HeartbeatKey]; got != old {
		t.Errorf("the heartbeat annotation is %q, want the earlier release's %q left alone", got, old)
	}
}
