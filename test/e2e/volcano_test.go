//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestVolcanoAnnotationSecondWriter runs the agent beside a writer that behaves like Volcano's
// device plugin (delete volcano.sh/gpu-unhealthy-ids at start, write its own list on XIDs, never
// read the key) on a real API server: the value is always the union, gpuhealth removes only its
// own index on recovery, and each foreign change costs the agent at most one write.
func TestVolcanoAnnotationSecondWriter(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	const node = "volcano-beside"
	gpuNode(t, c, node, 8)
	volcanoWrites := func(value any) {
		t.Helper()
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{gpuhealthv1.UnhealthyIDsKey: value}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Admin().CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "volcano-device-plugin"}); err != nil {
			t.Fatal(err)
		}
	}
	waitIDs := func(want string) {
		t.Helper()
		eventually(t, "ids "+want, func(ctx context.Context) (bool, string, error) {
			ann, err := nodeAnnotations(ctx, c, node)
			return err == nil && ann[gpuhealthv1.UnhealthyIDsKey] == want, fmt.Sprintf("ids=%q", ann[gpuhealthv1.UnhealthyIDsKey]), err
		})
	}

	volcanoWrites(nil) // Volcano's plugin starts first: deletes the key.
	// GPU 1 has a double-bit ECC error at 2 s, reset at 20 s.
	a := startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: "events:\n  - {at: 2s, gpu: 1, xid: 48}\n  - {at: 20s, gpu: 1, reset: true}\n"})
	waitIDs("1")

	before := a.writes()["annotation"]
	volcanoWrites("5") // an XID on GPU 5 in Volcano's plugin: its own list replaces the value
	waitIDs("1,5")
	volcanoWrites("5,6")
	waitIDs("1,5,6")
	// Give the agent time to do anything more it would do, then count.
	time.Sleep(2 * time.Second)
	if d := a.writes()["annotation"] - before; d > 2 {
		t.Errorf("the agent wrote %d times for 2 foreign changes, want at most 2", d)
	}

	// GPU 1 is reset: only gpuhealth's index goes.
	waitIDs("5,6")

	// Volcano's plugin restarts: deletes the key. Nothing of gpuhealth's is Unhealthy: it stays gone.
	volcanoWrites(nil)
	time.Sleep(2 * time.Second)
	ann, err := nodeAnnotations(ctx, c, node)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := ann[gpuhealthv1.UnhealthyIDsKey]; ok {
		t.Errorf("after Volcano's restart with nothing Unhealthy for gpuhealth: %s = %q, want absent", gpuhealthv1.UnhealthyIDsKey, v)
	}
}
