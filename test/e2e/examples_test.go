//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// The examples (examples/dra-driver, examples/device-plugin) are modules of their own that use
// only gpuhealth's public packages. These tests build them as an embedder would (go build in
// the module's directory) and run them against a real kubelet: proof from outside that the
// public library is enough to write a GPU DRA driver or device plugin with health.

var (
	exampleBuilds sync.Map // example name → *exampleBuild
)

type exampleBuild struct {
	once sync.Once
	path string
	err  error
}

// exampleBinary builds examples/<name> once per test binary.
func exampleBinary(t *testing.T, name string) string {
	t.Helper()
	v, _ := exampleBuilds.LoadOrStore(name, &exampleBuild{})
	b := v.(*exampleBuild)
	b.once.Do(func() {
		root, err := controlplane.RepoRoot()
		if err != nil {
			b.err = err
			return
		}
		dir, err := os.MkdirTemp("", "gpuhealth-example-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-o", b.path, ".")
		cmd.Dir = filepath.Join(root, "examples", name)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build in examples/%s: %w\n%s", name, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// startExample starts an example binary; it must exit 0 on the SIGTERM that stops it when the
// test ends, and its log is shown when the test failed.
func startExample(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	name := filepath.Base(bin)
	p := startProcess(t, name, filepath.Join(t.TempDir(), name+".log"), bin, args...)
	t.Cleanup(func() { // runs before startProcess's own: stop, then check how it ended
		p.stop(t)
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("%s exited with %d", name, code)
		}
	})
	return p
}

// writeScenario writes a scenario of count simulated GPUs on node with the given events.
func writeScenario(t *testing.T, node string, count int, events string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scenario.yaml")
	body := fmt.Sprintf("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: %s\ngpus: {count: %d}\nevents:\n%s", node, count, events)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// driverSlice returns the ResourceSlice the driver published for node, or nil.
func driverSlice(ctx context.Context, c *controlplane.Cluster, node string) (*resourcev1.ResourceSlice, error) {
	list, err := c.Admin().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		s := &list.Items[i]
		if s.Spec.Driver == controlplane.GPUDriver && s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			return s, nil
		}
	}
	return nil, nil
}

// sliceTaints returns the taints of one device of the driver's slice on node.
func sliceTaints(ctx context.Context, c *controlplane.Cluster, node, device string) ([]resourcev1.DeviceTaint, error) {
	s, err := driverSlice(ctx, c, node)
	if err != nil || s == nil {
		return nil, err
	}
	for _, d := range s.Spec.Devices {
		if d.Name == device {
			return d.Taints, nil
		}
	}
	return nil, fmt.Errorf("no device %s in slice %s", device, s.Name)
}

// resourceHealth returns what the kubelet says in pod status about the claim's devices
// (status.containerStatuses[].allocatedResourcesStatus), and that status as JSON for the log.
func resourceHealth(ctx context.Context, c *controlplane.Cluster, ns, pod, claim string) ([]corev1.ResourceHealth, string, error) {
	p, err := c.Admin().CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return nil, "", err
	}
	var out []corev1.ResourceHealth
	var statuses []corev1.ResourceStatus
	for _, cs := range p.Status.ContainerStatuses {
		statuses = append(statuses, cs.AllocatedResourcesStatus...)
		for _, rs := range cs.AllocatedResourcesStatus {
			if rs.Name == corev1.ResourceName("claim:"+claim) {
				out = append(out, rs.Resources...)
			}
		}
	}
	b, _ := json.Marshal(statuses)
	return out, string(b), nil
}

// logPodStatus logs the containers' statuses of a pod as JSON: the record of what the kubelet
// said.
func logPodStatus(t *testing.T, c *controlplane.Cluster, ns, name, when string) {
	t.Helper()
	p, err := c.Admin().CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Error(err)
		return
	}
	b, _ := json.MarshalIndent(p.Status.ContainerStatuses, "", "  ")
	t.Logf("pod %s/%s %s: status.containerStatuses = %s", ns, name, when, b)
}

// TestExamplesDRADriver runs examples/dra-driver against a real kubelet: it registers, publishes
// a ResourceSlice in the shape of NVIDIA's driver, the scheduler allocates a claim for one GPU
// from it, the kubelet prepares the claim (CDI device with NVIDIA_VISIBLE_DEVICES) and runs the
// pod. Then the simulated GPU gets a double-bit ECC error (XID 48) and later a reset: the
// kubelet shows the device Unhealthy in the pod's allocatedResourcesStatus (fed by the
// driver's health stream) and the driver taints the device in its own slice; after the reset
// both clear. A drain (the Node annotation `gpuhealth drain` writes) does the same until the
// undrain. Deleting the pod unprepares the claim.
func TestExamplesDRADriver(t *testing.T) {
	t.Parallel()
	bin := exampleBinary(t, "dra-driver")
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	const ns, claimName = "example-dra", "train"
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}

	// GPU 1 gets XID 48 (Unhealthy until a GPU reset) faultAt after the driver starts, and is
	// reset at resetAt. The first leaves time for the pod to run on it first.
	const faultAt, resetAt = 30 * time.Second, 55 * time.Second
	scenario := writeScenario(t, node.Name, 4, fmt.Sprintf("  - {at: %s, gpu: 1, xid: 48}\n  - {at: %s, gpu: 1, reset: true}\n", faultAt, resetAt))
	cdiDir := t.TempDir()
	driver := startExample(t, bin,
		"--kubeconfig", node.Kubeconfig(), // the node's identity: the Node authorizer lets it publish its slices and read its claims
		"--node-name", node.Name,
		"--registrar-dir", node.PluginsRegistryDir(),
		"--plugin-dir", filepath.Join(node.PluginsDir(), controlplane.GPUDriver),
		"--cdi-dir", cdiDir,
		"--scenario", scenario,
		"--checkpoint", filepath.Join(t.TempDir(), "checkpoint.json"),
		"-v", "4")
	uuid := simUUID(node.Name, 1)

	t.Run("the driver publishes its GPUs in the shape of NVIDIA's driver", func(t *testing.T) {
		eventually(t, "the driver's ResourceSlice", func(ctx context.Context) (bool, string, error) {
			if gone, log := driver.exited(); gone {
				return false, "", fmt.Errorf("the driver exited:\n%s", log)
			}
			s, err := driverSlice(ctx, c, node.Name)
			if err != nil || s == nil {
				return false, "no slice yet", err
			}
			return len(s.Spec.Devices) == 4, fmt.Sprintf("%d devices", len(s.Spec.Devices)), nil
		})
		s, err := driverSlice(ctx, c, node.Name)
		if err != nil {
			t.Fatal(err)
		}
		if s.Spec.Pool.Name != node.Name {
			t.Errorf("pool %q, want the node's name", s.Spec.Pool.Name)
		}
		for i, d := range s.Spec.Devices {
			a := d.Attributes
			if d.Name != controlplane.GPUDeviceName(i) || a["uuid"].StringValue == nil || *a["uuid"].StringValue != simUUID(node.Name, i) ||
				a["index"].IntValue == nil || *a["index"].IntValue != int64(i) || a["productName"].StringValue == nil || *a["type"].StringValue != "gpu" {
				t.Errorf("device %d: %s %v", i, d.Name, a)
			}
			if len(d.Taints) > 0 {
				t.Errorf("device %s is tainted before any fault: %v", d.Name, d.Taints)
			}
		}
	})

	var claimUID string
	t.Run("a pod with a claim for GPU 1 runs, prepared as a CDI device", func(t *testing.T) {
		pod := podWithClaim(t, c, pinnedClaim(ns, claimName, uuid, ""), node.Name)
		waitPodRunning(t, c, ns, pod.Name)
		if time.Since(driver.started) >= faultAt {
			t.Fatalf("the pod ran %s after the driver started, after the fault at %s: make faultAt larger", time.Since(driver.started).Round(time.Second), faultAt)
		}
		t.Logf("driver start → pod Running: %s", time.Since(driver.started).Round(100*time.Millisecond))
		claim, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claimUID = string(claim.UID)
		cdiID := "k8s.gpu.nvidia.com/device=" + claimUID + "-gpu-1"
		logs, err := podLogs(ctx, c, ns, pod.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logs, "cdi "+cdiID) {
			t.Errorf("the container did not get CDI device %s:\n%s", cdiID, logs)
		}
		spec, err := os.ReadFile(filepath.Join(cdiDir, "k8s.gpu.nvidia.com-device_"+claimUID+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(spec), "NVIDIA_VISIBLE_DEVICES="+uuid) {
			t.Errorf("CDI spec lacks NVIDIA_VISIBLE_DEVICES=%s:\n%s", uuid, spec)
		}
	})
	if claimUID == "" {
		t.FailNow()
	}

	// waitHealth waits until pod status shows the claim's device with want, until deadline.
	waitHealth := func(t *testing.T, want corev1.ResourceHealthStatus, deadline time.Time) {
		t.Helper()
		var last string
		eventuallyWithin(t, time.Until(deadline), "allocatedResourcesStatus "+string(want), func(ctx context.Context) (bool, string, error) {
			rh, js, err := resourceHealth(ctx, c, ns, claimName, claimName)
			last = js
			return len(rh) == 1 && rh[0].Health == want, js, err
		})
		t.Logf("allocatedResourcesStatus (%s after the driver started): %s", time.Since(driver.started).Round(100*time.Millisecond), last)
	}
	// waitTaint waits until gpu-1 in the driver's slice carries exactly the taint key=value
	// (NoSchedule), or none when key is empty.
	waitTaint := func(t *testing.T, key, value string, deadline time.Time) {
		t.Helper()
		eventuallyWithin(t, time.Until(deadline), fmt.Sprintf("gpu-1 tainted %q=%q in the driver's slice", key, value), func(ctx context.Context) (bool, string, error) {
			ts, err := sliceTaints(ctx, c, node.Name, "gpu-1")
			if err != nil {
				return false, "", err
			}
			if key == "" {
				return len(ts) == 0, fmt.Sprint(ts), nil
			}
			return len(ts) == 1 && ts[0].Key == key && ts[0].Value == value && ts[0].Effect == resourcev1.DeviceTaintEffectNoSchedule,
				fmt.Sprint(ts), nil
		})
	}

	t.Run("pod status shows the GPU Healthy", func(t *testing.T) {
		waitHealth(t, corev1.ResourceHealthStatusHealthy, driver.started.Add(faultAt))
		logPodStatus(t, c, ns, claimName, "before the fault")
	})

	t.Run("the fault makes it Unhealthy in pod status and taints it in the slice", func(t *testing.T) {
		deadline := driver.started.Add(faultAt + pollTimeout)
		waitHealth(t, corev1.ResourceHealthStatusUnhealthy, deadline)
		logPodStatus(t, c, ns, claimName, "after XID 48")
		waitTaint(t, "gpuhealth.dev/xid", "48", deadline)
		// A NoSchedule taint leaves the running pod alone.
		if pod, err := c.Admin().CoreV1().Pods(ns).Get(ctx, claimName, metav1.GetOptions{}); err != nil || pod.Status.Phase != corev1.PodRunning {
			t.Errorf("the pod should keep running: %v", err)
		}
	})

	t.Run("the reset makes it Healthy again and clears the taint", func(t *testing.T) {
		deadline := driver.started.Add(resetAt + pollTimeout)
		waitHealth(t, corev1.ResourceHealthStatusHealthy, deadline)
		logPodStatus(t, c, ns, claimName, "after the reset")
		waitTaint(t, "", "", deadline)
	})

	t.Run("a drain makes it Unhealthy and tainted, an undrain gives it back", func(t *testing.T) {
		// What `gpuhealth drain NODE 1` writes: the drains annotation of pkg/api/v1.
		drains, err := json.Marshal(map[string]gpuhealthv1.Drain{uuid: {Index: 1, Reason: "fan replacement", By: "e2e", At: time.Now()}})
		if err != nil {
			t.Fatal(err)
		}
		setDrains := func(value string) {
			t.Helper()
			patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{gpuhealthv1.DrainsKey: value}}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Admin().CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		setDrains(string(drains))
		waitHealth(t, corev1.ResourceHealthStatusUnhealthy, time.Now().Add(pollTimeout))
		logPodStatus(t, c, ns, claimName, "drained")
		waitTaint(t, "gpuhealth.dev/admin-drain", "AdminDrain", time.Now().Add(pollTimeout))
		setDrains("")
		waitHealth(t, corev1.ResourceHealthStatusHealthy, time.Now().Add(pollTimeout))
		waitTaint(t, "", "", time.Now().Add(pollTimeout))
	})

	t.Run("deleting the pod unprepares the claim", func(t *testing.T) {
		if err := c.Admin().CoreV1().Pods(ns).Delete(ctx, claimName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the claim's CDI spec removed", func(context.Context) (bool, string, error) {
			_, err := os.Stat(filepath.Join(cdiDir, "k8s.gpu.nvidia.com-device_"+claimUID+".json"))
			return os.IsNotExist(err), fmt.Sprint(err), nil
		})
	})
}

// TestExamplesDevicePlugin runs examples/device-plugin against a real kubelet: it registers, the
// node gets nvidia.com/gpu capacity, a pod asking for one GPU runs with it in
// NVIDIA_VISIBLE_DEVICES, a fault makes allocatable drop, and a reset gives the GPU back.
func TestExamplesDevicePlugin(t *testing.T) {
	t.Parallel()
	bin := exampleBinary(t, "device-plugin")
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	const ns = "example-dp"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	const faultAt, resetAt = 30 * time.Second, 55 * time.Second
	scenario := writeScenario(t, node.Name, 4, fmt.Sprintf("  - {at: %s, gpu: 2, xid: 48}\n  - {at: %s, gpu: 2, reset: true}\n", faultAt, resetAt))
	plugin := startExample(t, bin, "--kubelet-socket-dir", node.DevicePluginDir(), "--scenario", scenario, "-v", "4")

	t.Run("the node gets 4 nvidia.com/gpu", func(t *testing.T) {
		registered := waitGPUs(t, c, node.Name, 4, 4)
		t.Logf("plugin start → allocatable 4: %s", registered.Sub(plugin.started).Round(100*time.Millisecond))
	})

	t.Run("a pod asking for one GPU runs with it", func(t *testing.T) {
		if _, err := c.Admin().CoreV1().Pods(ns).Create(ctx, gpuPod(ns, "one", node.Name, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodRunning(t, c, ns, "one")
		held := podResourcesGPUs(t, node, ns, "one")
		if len(held) != 1 {
			t.Fatalf("pod-resources: the pod holds %v, want one GPU", held)
		}
		logs, err := podLogs(ctx, c, ns, "one")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logs, "NVIDIA_VISIBLE_DEVICES="+held[0]) {
			t.Errorf("container environment lacks NVIDIA_VISIBLE_DEVICES=%s:\n%s", held[0], logs)
		}
	})

	t.Run("the fault makes allocatable drop", func(t *testing.T) {
		dropped := waitGPUsWithin(t, c, node.Name, 4, 3, time.Until(plugin.started.Add(faultAt))+pollTimeout)
		t.Logf("fault → allocatable 3: %s", dropped.Sub(plugin.started.Add(faultAt)).Round(100*time.Millisecond))
	})

	t.Run("the reset gives the GPU back", func(t *testing.T) {
		back := waitGPUsWithin(t, c, node.Name, 4, 4, time.Until(plugin.started.Add(resetAt))+pollTimeout)
		t.Logf("reset → allocatable 4: %s", back.Sub(plugin.started.Add(resetAt)).Round(100*time.Millisecond))
	})
}
