//go:build e2e

package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/internal/report/annotation"
	"github.com/gpuhealth/gpuhealth/internal/report/hami"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// beforeFirstNodePatch is a RoundTripper that runs hook once, just before the first PATCH of a
// Node goes to the API server: another writer's write lands between the agent's read of the Node
// and its write, deterministically.
type beforeFirstNodePatch struct {
	next http.RoundTripper
	once sync.Once
	hook func()
}

func (b *beforeFirstNodePatch) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPatch && strings.Contains(r.URL.Path, "/api/v1/nodes/") {
		b.once.Do(b.hook)
	}
	return b.next.RoundTrip(r)
}

// TestSharedListsLoseNoConcurrentWrite races another writer against the agent's syncers of the
// shared lists on a real API server: Volcano's device plugin writes its list of indexes (and an
// operator HAMi's cordon) between the syncer's read of the Node and its patch. The patch carries
// the Node's resourceVersion, the API server refuses it with Conflict, and the syncer merges
// again on the Node as it is: the other writer's entry stays. (An unconditional merge patch wrote
// gpuhealth's entries over it, and the bookkeeping then lost it for good.)
func TestSharedListsLoseNoConcurrentWrite(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	sick := func(node string) health.Snapshot {
		var snap health.Snapshot
		for i := range 4 {
			d := health.DeviceStatus{Device: health.Device{UUID: sim.GPUUUID(node, i), Index: i}, Health: health.Healthy}
			if i == 1 {
				d.Health = health.Unhealthy
			}
			snap.Devices = append(snap.Devices, d)
		}
		return snap
	}
	for _, tc := range []struct {
		name, key, foreign, want string
		syncer                   func(kube.Interface, string) report.Syncer
	}{
		{"volcano", gpuhealthv1.UnhealthyIDsKey, "6", "1,6",
			func(cl kube.Interface, node string) report.Syncer {
				return annotation.New(cl, node, annotation.Options{})
			}},
		{"hami", gpuhealthv1.HAMiCordonKey, "GPU-operator-cordoned", "", // want: set below
			func(cl kube.Interface, node string) report.Syncer { return hami.New(cl, node, hami.Options{}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := "race-" + tc.name
			if _, err := c.CreateReadyNode(ctx, node, nil); err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if tc.name == "hami" {
				want = sim.GPUUUID(node, 1) + "," + tc.foreign
			}
			cfg := c.AdminConfig()
			cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
				return &beforeFirstNodePatch{next: rt, hook: func() {
					body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{tc.key: tc.foreign}}})
					if _, err := c.Admin().CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "other-writer"}); err != nil {
						t.Error(err)
					}
				}}
			})
			client, err := kube.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tc.syncer(client, node).Sync(ctx, sick(node)); err != nil {
				t.Fatal(err)
			}
			n, err := c.Admin().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := n.Annotations[tc.key]; !sameEntries(got, want) {
				t.Errorf("%s = %q after a write raced the agent's, want %q: the other writer's entry was lost", tc.key, got, want)
			}
		})
	}
}

// sameEntries compares two comma-separated lists as sets.
func sameEntries(a, b string) bool {
	as, bs := strings.Split(a, ","), strings.Split(b, ",")
	if len(as) != len(bs) {
		return false
	}
	for _, x := range as {
		if !strings.Contains(","+b+",", ","+x+",") {
			return false
		}
	}
	return true
}
