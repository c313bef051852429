package hami_test

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/hami"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// snapshot returns 3 GPUs and one MIG instance of GPU-b; the named UUIDs are Unhealthy.
func snapshot(unhealthy ...string) health.Snapshot {
	devs := []health.DeviceStatus{
		{Device: health.Device{UUID: "GPU-a", Index: 0}},
		{Device: health.Device{UUID: "GPU-b", Index: 1}},
		{Device: health.Device{UUID: "GPU-c", Index: 2}},
		{Device: health.Device{UUID: "MIG-b1", Index: 1, MIG: &health.MIGPlacement{ParentUUID: "GPU-b", GPUInstance: 1}}},
	}
	for i := range devs {
		devs[i].Health = health.Healthy
		for _, u := range unhealthy {
			if devs[i].Device.UUID == u {
				devs[i].Health = health.Unhealthy
			}
		}
	}
	return health.Snapshot{Devices: devs}
}

func TestCordonBesideAnOperator(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	s := hami.New(adapt.Clientset(client), "n1", hami.Options{})
	operator := func(value any) func(t *testing.T) {
		return func(t *testing.T) {
			body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{gpuhealthv1.HAMiCordonKey: value}}})
			if _, err := client.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	steps := []struct {
		name       string
		act        func(t *testing.T)
		unhealthy  []string
		wantWrites int
		want       string
	}{
		{"all healthy: only the (empty) state is recorded", nil, nil, 1, ""},
		{"GPU-c Unhealthy: cordoned", nil, []string{"GPU-c"}, 1, "GPU-c"},
		{"a MIG instance's fault does not cordon its card", nil, []string{"GPU-c", "MIG-b1"}, 0, "GPU-c"},
		{"an operator cordons GPU-a by hand (replacing the value)", operator("GPU-a"), []string{"GPU-c"}, 1, "GPU-a,GPU-c"},
		{"GPU-c recovers: only gpuhealth's entry goes", nil, nil, 1, "GPU-a"},
		{"the operator uncordons: the key goes", operator(nil), nil, 1, ""},
		{"an operator writes a blank-separated mess: kept verbatim", operator("GPU-a GPU-b"), []string{"GPU-b"}, 1, "GPU-b,GPU-a GPU-b"},
	}
	for _, st := range steps {
		if st.act != nil {
			st.act(t)
		}
		writes, err := s.Sync(ctx, snapshot(st.unhealthy...))
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		node, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, present := node.Annotations[gpuhealthv1.HAMiCordonKey]
		if got != st.want || present != (st.want != "") {
			t.Errorf("%s: %s = %q (present %v), want %q", st.name, gpuhealthv1.HAMiCordonKey, got, present, st.want)
		}
		if writes != st.wantWrites {
			t.Errorf("%s: %d writes, want %d", st.name, writes, st.wantWrites)
		}
		if again, err := s.Sync(ctx, snapshot(st.unhealthy...)); err != nil || again != 0 {
			t.Errorf("%s: second sync wrote %d times (err %v)", st.name, again, err)
		}
	}
}

func TestCordoned(t *testing.T) {
	got := hami.Cordoned(snapshot("GPU-c", "GPU-a", "MIG-b1"))
	if len(got) != 2 || got[0] != "GPU-a" || got[1] != "GPU-c" {
		t.Errorf("Cordoned = %v, want [GPU-a GPU-c]", got)
	}
}
