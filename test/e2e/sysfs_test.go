//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuhealth/gpuhealth/internal/nodegpu"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestAgentOnASurprisingSysfs gives real agents a PCI bus (a sysfs tree the test writes) that
// holds, beside the simulator's three GPUs, a GPU bound to vfio-pci (passed through to a
// virtual machine) and a function whose vendor is a FIFO. The FIFO blocked the agent's start
// for good; the vfio-pci GPU became an Unhealthy MISSING- GPU with a True GPUUnhealthy
// condition. By default the agent starts, leaves the vfio-pci GPU out, reports the node healthy
// and says so once in a GPUBoundToOtherDriver Event; with inventory.otherDrivers: missing it
// reports that GPU missing.
func TestAgentOnASurprisingSysfs(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	sysfs := t.TempDir()
	for i := range 3 { // the simulator's GPU i sits at 0000:1i:00.0
		sysfsGPU(t, sysfs, fmt.Sprintf("0000:1%d:00.0", i), "nvidia")
	}
	sysfsGPU(t, sysfs, "0000:13:00.0", "vfio-pci")
	fifo := filepath.Join(sysfsGPU(t, sysfs, "0000:14:00.0", ""), "vendor")
	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	kubeconfig := agentKubeconfig(t, c)
	const leftOut, counted = "sysfs-left-out", "sysfs-counted-missing"
	gpuNode(t, c, leftOut, 3)
	gpuNode(t, c, counted, 3)
	startAgent(t, agentSetup{node: leftOut, gpus: 3, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		topConfig: "inventory: {sysfsRoot: " + sysfs + "}\n"})
	startAgent(t, agentSetup{node: counted, gpus: 3, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		topConfig: "inventory: {sysfsRoot: " + sysfs + ", otherDrivers: missing}\n"})

	report := func(ctx context.Context, node string) (map[string]gpuhealthv1.GPUSummary, corev1.NodeCondition, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return nil, corev1.NodeCondition{}, err
		}
		sums, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
		if err != nil {
			return nil, corev1.NodeCondition{}, err
		}
		cond, err := nodeCondition(ctx, c, node, nodecondition.Type)
		return sums, cond, err
	}
	eventually(t, "the vfio-pci GPU left out, the node healthy, one Event naming it", func(ctx context.Context) (bool, string, error) {
		sums, cond, err := report(ctx, leftOut)
		if err != nil {
			return false, "", err
		}
		events, err := nodeEvents(ctx, c, leftOut, nodegpu.EventGPUBoundToOtherDriver)
		if err != nil {
			return false, "", err
		}
		healthy := len(sums) == 3
		for _, s := range sums {
			healthy = healthy && s.Health == "Healthy" && !s.Missing
		}
		ok := healthy && cond.Status == corev1.ConditionFalse && len(events) == 1 && events[0].Count <= 1 &&
			events[0].Type == corev1.EventTypeNormal && strings.HasSuffix(events[0].Message, ": 0000:13:00.0 (vfio-pci)")
		var said []string
		for _, e := range events {
			said = append(said, fmt.Sprintf("%s x%d %q", e.Type, e.Count, e.Message))
		}
		return ok, fmt.Sprintf("gpus=%v condition=%s %q events=%v", sums, cond.Status, cond.Message, said), nil
	})
	const placeholder = "MISSING-0000:13:00.0"
	eventually(t, "the vfio-pci GPU counted missing when configured so", func(ctx context.Context) (bool, string, error) {
		sums, cond, err := report(ctx, counted)
		if err != nil {
			return false, "", err
		}
		m := sums[placeholder]
		ok := len(sums) == 4 && m.Missing && m.Health == "Unhealthy" &&
			cond.Status == corev1.ConditionTrue && strings.Contains(cond.Message, "the node runs 3 of its 4 GPUs")
		return ok, fmt.Sprintf("missing=%+v (of %d) condition=%s %q", m, len(sums), cond.Status, cond.Message), nil
	})
}

// sysfsGPU writes an NVIDIA H100's attributes at addr under the sysfs tree root, bound to driver
// ("": unbound) as the kernel links it, and returns its directory.
func sysfsGPU(t *testing.T, root, addr, driver string) string {
	t.Helper()
	dir := filepath.Join(root, "bus", "pci", "devices", addr)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"vendor": "0x10de", "device": "0x2330", "class": "0x030200"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if driver != "" {
		if err := os.Symlink("../../../../bus/pci/drivers/"+driver, filepath.Join(dir, "driver")); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
