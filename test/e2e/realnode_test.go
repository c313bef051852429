//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

func simUUID(node string, index int) string { return sim.GPUUUID(node, index) }

// realGPUNode starts a real kubelet node with a ResourceSlice of count GPUs (the simulator's
// UUIDs for that node) and a DRA kubelet plugin that prepares claims there, as NVIDIA's driver
// would. The cluster needs a node network (Options.NodeNetwork or KubeletNodes).
func realGPUNode(t *testing.T, c *controlplane.Cluster, name string, count int) ([]string, *controlplane.DRAPlugin) {
	t.Helper()
	ctx := t.Context()
	node := c.KubeletNode(name)
	if node == nil {
		var err error
		if node, err = c.StartKubeletNode(ctx, name, controlplane.KubeletNodeOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	uuids := make([]string, count)
	for i := range uuids {
		uuids[i] = simUUID(name, i)
	}
	if _, err := c.Admin().ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(name, uuids...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	plugin, err := c.StartDRAPlugin(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plugin.Stop)
	eventually(t, "DRA plugin registered with the kubelet of "+name, func(context.Context) (bool, string, error) {
		return plugin.Registered(), "", nil
	})
	return uuids, plugin
}

// podResourcesGPUs asks the kubelet's pod-resources API (List) which nvidia.com/gpu devices the
// pod's containers hold.
func podResourcesGPUs(t *testing.T, node *controlplane.KubeletNode, ns, pod string) []string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+node.PodResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("pod-resources List: %v", err)
	}
	var ids []string
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() != ns || p.GetName() != pod {
			continue
		}
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				if d.GetResourceName() == string(gpuResource) {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
	}
	return ids
}

// These tests run real kubelets (v1.37.2, fake CRI runtime) in the harness's node network: what
// they check is the kubelet's own behaviour, which FakeKubelet and deviceplugintest only imitate.

// plainPod is a pod with one container and no GPU, pinned to node.
func plainPod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{{Name: "main", Image: "gpuhealth.dev/e2e/workload:1"}},
		},
	}
}

// waitPodRunning waits until the kubelet reports the pod Running.
func waitPodRunning(t *testing.T, c *controlplane.Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, "pod "+name+" Running", func(ctx context.Context) (bool, string, error) {
		var err error
		pod, err = c.Admin().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return pod.Status.Phase == corev1.PodRunning, fmt.Sprintf("phase %s on %q", pod.Status.Phase, pod.Spec.NodeName), nil
	})
	return pod
}

// podLogs reads a container's log through kube-apiserver, which fetches it from the kubelet
// (through the node network's egress proxy).
func podLogs(ctx context.Context, c *controlplane.Cluster, ns, name string) (string, error) {
	b, err := c.Admin().CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	return string(b), err
}

// mountsUnder lists the machine's mount points under dir (this process's mount namespace is the
// machine's).
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// TestRealNodeHarness proves the harness's real node behaves as a cluster node: it registers and
// turns schedulable through the real node-lifecycle controller, with its address in the node
// network; a pod runs (phase from the kubelet); `kubectl logs` reaches the kubelet through the
// egress proxy; and stopping the cluster leaves no process, mount or network namespace behind.
func TestRealNodeHarness(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	if node == nil {
		t.Fatal("no real node")
	}

	t.Run("node registered by the kubelet", func(t *testing.T) {
		n, err := c.Admin().CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Status.NodeInfo.KubeletVersion; got != controlplane.KubernetesVersion {
			t.Errorf("kubelet version %q, want %s", got, controlplane.KubernetesVersion)
		}
		var internal string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = a.Address
			}
		}
		if internal != node.IP.String() || !strings.HasPrefix(internal, "198.51.100.") {
			t.Errorf("InternalIP %q, want %s in %s", internal, node.IP, controlplane.NodeNetworkCIDR)
		}
		for _, dir := range []string{node.DevicePluginDir(), node.PluginsRegistryDir(), node.PluginsDir()} {
			if _, err := os.Stat(dir); err != nil {
				t.Error(err)
			}
		}
		if _, err := os.Stat(filepath.Join(node.DevicePluginDir(), "kubelet.sock")); err != nil {
			t.Errorf("the kubelet's device-plugin socket is not in the node's device-plugin directory: %v", err)
		}
		if _, err := os.Stat(node.PodResourcesSocket()); err != nil {
			t.Errorf("pod-resources socket: %v", err)
		}
	})

	t.Run("a pod runs and kubectl logs reaches the kubelet", func(t *testing.T) {
		if _, err := c.CreateNamespace(ctx, "plain"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Admin().CoreV1().Pods("plain").Create(ctx, plainPod("plain", "hello", node.Name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodRunning(t, c, "plain", "hello")
		eventually(t, "logs through the API server", func(ctx context.Context) (bool, string, error) {
			logs, err := podLogs(ctx, c, "plain", "hello")
			if err != nil {
				return false, err.Error(), nil
			}
			return strings.Contains(logs, "fake container main started"), logs, nil
		})
		// The same through kubectl, as a person would.
		out, err := exec.CommandContext(ctx, filepath.Join(c.BinDir(), controlplane.BinKubectl),
			"--kubeconfig", c.AdminKubeconfig(), "logs", "-n", "plain", "hello").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "fake container main started") {
			t.Errorf("kubectl logs: %v\n%s", err, out)
		}
	})

	t.Run("a kubelet that fails to start fails fast with its log", func(t *testing.T) {
		before := len(c.Processes())
		start := time.Now()
		// The kubelet itself refuses labels in the kubernetes.io namespace that it may not set.
		_, err := c.StartKubeletNode(ctx, "broken", controlplane.KubeletNodeOptions{Labels: map[string]string{"kubernetes.io/not-allowed": "x"}})
		if err == nil {
			t.Fatal("the kubelet started with a forbidden label")
		}
		if !strings.Contains(err.Error(), "kubelet-broken") || !strings.Contains(err.Error(), "not-allowed") {
			t.Errorf("the error lacks the kubelet's log tail: %v", err)
		}
		if waited := time.Since(start); waited > pollTimeout {
			t.Errorf("took %s to notice the kubelet had exited", waited)
		}
		if c.KubeletNode("broken") != nil {
			t.Error("the broken node is still listed")
		}
		if after := len(c.Processes()); after != before {
			t.Errorf("%d processes after the failed start, %d before: the node's runtime was left running", after, before)
		}
	})

	t.Run("stopping leaves nothing behind", func(t *testing.T) {
		var pids []int
		for _, p := range c.Processes() {
			pids = append(pids, p.PID)
		}
		dir := c.Dir()
		if err := c.Stop(); err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, 0); err == nil {
				t.Errorf("pid %d still runs", pid)
			}
		}
		if m := mountsUnder(t, dir); len(m) > 0 {
			t.Errorf("mounts left under %s: %v", dir, m)
		}
		for _, host := range []string{"/var/lib/kubelet", "/var/log/pods", "/var/log/containers"} {
			if _, err := os.Stat(host); err == nil {
				t.Logf("note: %s exists on this machine (not created by the harness, which mounts tmpfs over its parent)", host)
			}
		}
	})
}

// startDevicePlugin starts `gpuhealth device-plugin --backend sim` registered with a real kubelet.
func startDevicePlugin(t *testing.T, node *controlplane.KubeletNode, scenario, checkpoint string, extraArgs ...string) *process {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "scenario.yaml")
	body := fmt.Sprintf("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: %s\ngpus: {count: 8}\n%s", node.Name, scenario)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"device-plugin", "--backend", "sim", "--scenario", path,
		"--kubelet-socket-dir", node.DevicePluginDir(), "--checkpoint", checkpoint, "-v", "4"}, extraArgs...)
	return startProcess(t, "device-plugin", filepath.Join(dir, "device-plugin.log"), gpuhealthBinary(t), args...)
}

// gpuCounts returns the node's nvidia.com/gpu capacity and allocatable.
func gpuCounts(ctx context.Context, c *controlplane.Cluster, node string) (capacity, allocatable int64, err error) {
	n, err := c.Admin().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return 0, 0, err
	}
	q := n.Status.Capacity[gpuResource]
	a := n.Status.Allocatable[gpuResource]
	return q.Value(), a.Value(), nil
}

const gpuResource = corev1.ResourceName("nvidia.com/gpu")

func waitGPUs(t *testing.T, c *controlplane.Cluster, node string, capacity, allocatable int64) time.Time {
	t.Helper()
	return waitGPUsWithin(t, c, node, capacity, allocatable, pollTimeout)
}

func waitGPUsWithin(t *testing.T, c *controlplane.Cluster, node string, capacity, allocatable int64, timeout time.Duration) time.Time {
	t.Helper()
	eventuallyWithin(t, timeout, fmt.Sprintf("nvidia.com/gpu capacity %d allocatable %d", capacity, allocatable), func(ctx context.Context) (bool, string, error) {
		gotC, gotA, err := gpuCounts(ctx, c, node)
		return gotC == capacity && gotA == allocatable, fmt.Sprintf("capacity %d allocatable %d", gotC, gotA), err
	})
	return time.Now()
}

// gpuPod asks for n nvidia.com/gpu on node.
func gpuPod(ns, name, node string, n int64) *corev1.Pod {
	pod := plainPod(ns, name, node)
	q := *resource.NewQuantity(n, resource.DecimalSI)
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Limits: corev1.ResourceList{gpuResource: q}, Requests: corev1.ResourceList{gpuResource: q},
	}
	return pod
}

// TestRealNodeDevicePlugin runs `gpuhealth device-plugin --backend sim` against a real kubelet:
// the kubelet's device manager turns the plugin's health into the node's allocatable, the
// scheduler keeps pods that do not fit Pending, the kubelet calls Allocate for the pod that runs
// and reports its GPUs through the pod-resources API, recovery gives the GPU back, and both a
// kubelet restart and a plugin restart keep the count right.
func TestRealNodeDevicePlugin(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	const ns = "dp"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	checkpoint := filepath.Join(t.TempDir(), "device-plugin.json")
	// GPU 3 falls off the bus (until reboot), GPU 5 has a double-bit ECC error (until a GPU
	// reset) and is reset later. The first fault leaves time to see all 8 GPUs first.
	const faultAt = 40 * time.Second
	plugin := startDevicePlugin(t, node, fmt.Sprintf(`events:
  - {at: %s, gpu: 3, xid: 79}
  - {at: %s, gpu: 5, xid: 48}
  - {at: 75s, gpu: 5, reset: true}
`, faultAt, faultAt), checkpoint)

	t.Run("all 8 GPUs allocatable", func(t *testing.T) {
		registered := waitGPUs(t, c, node.Name, 8, 8)
		t.Logf("plugin start → allocatable 8: %s", registered.Sub(plugin.started).Round(100*time.Millisecond))
	})

	var running *corev1.Pod
	t.Run("two Unhealthy GPUs leave 6 allocatable", func(t *testing.T) {
		dropped := waitGPUs(t, c, node.Name, 8, 6)
		// The fault happens faultAt after the plugin's start (the sim's clock starts with it).
		t.Logf("fault → allocatable dropped: %s (the kubelet's node status period is 10s)",
			dropped.Sub(plugin.started.Add(faultAt)).Round(100*time.Millisecond))
	})

	t.Run("a pod wanting more than the healthy count stays Pending, one that fits runs", func(t *testing.T) {
		if _, err := c.Admin().CoreV1().Pods(ns).Create(ctx, gpuPod(ns, "too-big", node.Name, 7), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "too-big unschedulable for nvidia.com/gpu", func(ctx context.Context) (bool, string, error) {
			pod, err := c.Admin().CoreV1().Pods(ns).Get(ctx, "too-big", metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			for _, cond := range pod.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
					return strings.Contains(cond.Message, "Insufficient nvidia.com/gpu"), cond.Message, nil
				}
			}
			return false, "no PodScheduled condition", nil
		})
		if _, err := c.Admin().CoreV1().Pods(ns).Create(ctx, gpuPod(ns, "fits", node.Name, 2), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		running = waitPodRunning(t, c, ns, "fits")
	})

	t.Run("the kubelet called Allocate and pod-resources shows the pod's GPUs", func(t *testing.T) {
		if running == nil {
			t.Skip("no running pod")
		}
		held := podResourcesGPUs(t, node, ns, "fits")
		if len(held) != 2 {
			t.Fatalf("pod-resources: pod holds %v, want 2 GPUs", held)
		}
		for _, uuid := range held {
			if uuid == simUUID(node.Name, 3) || uuid == simUUID(node.Name, 5) {
				t.Errorf("the kubelet gave the pod Unhealthy GPU %s", uuid)
			}
		}
		// What Allocate returned reached the container runtime: the fake CRI logs the
		// container's environment.
		logs, err := podLogs(ctx, c, ns, "fits")
		if err != nil {
			t.Fatal(err)
		}
		want := "NVIDIA_VISIBLE_DEVICES=" + strings.Join(held, ",")
		if !strings.Contains(logs, want) {
			// The order of the UUIDs is Allocate's; pod-resources sorts nothing.
			slices.Reverse(held)
			if alt := "NVIDIA_VISIBLE_DEVICES=" + strings.Join(held, ","); !strings.Contains(logs, alt) {
				t.Errorf("container environment lacks %s:\n%s", want, logs)
			}
		}
	})

	t.Run("the reset GPU comes back", func(t *testing.T) {
		// The reset happens 75 s after the plugin's start, whenever this step begins.
		waitGPUsWithin(t, c, node.Name, 8, 7, time.Until(plugin.started.Add(75*time.Second))+pollTimeout)
	})

	t.Run("the plugin re-registers after a kubelet restart", func(t *testing.T) {
		if err := c.RestartKubelet(ctx, node.Name); err != nil {
			t.Fatal(err)
		}
		waitGPUs(t, c, node.Name, 8, 7)
		eventually(t, "device plugin re-registered", func(ctx context.Context) (bool, string, error) {
			b, err := os.ReadFile(plugin.log)
			n := strings.Count(string(b), "Registered with the kubelet")
			return n >= 2, strconv.Itoa(n) + " registrations", err
		})
	})

	t.Run("a plugin restart keeps the fault (checkpoint)", func(t *testing.T) {
		plugin.stop(t)
		// The kubelet marks a disconnected plugin's devices Unhealthy (and keeps the capacity for
		// a grace period): allocatable 0 proves the count below comes from the new plugin.
		waitGPUs(t, c, node.Name, 8, 0)
		// No faults this time: what stays Unhealthy comes from the checkpoint alone.
		startDevicePlugin(t, node, "events: []\n", checkpoint)
		waitGPUs(t, c, node.Name, 8, 7)
	})
}

// TestRealNodeDRANoExecuteEviction proves the DRA eviction path completes through a real kubelet:
// a pod holding a GPU through a ResourceClaim runs (the kubelet prepared the claim with the node's
// DRA plugin), the agent marks the GPU NoExecute when it falls off the bus, the real
// controller-manager evicts the pod, the real kubelet stops it and unprepares the claim, and the
// claim is released.
func TestRealNodeDRANoExecuteEviction(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	const ns = "dra-real"
	uuids, plugin := realGPUNode(t, c, node.Name, 8)
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}

	victim := podWithClaim(t, c, pinnedClaim(ns, "victim", uuids[3], ""), node.Name)
	waitPodRunning(t, c, ns, victim.Name)
	if got := plugin.Prepared(); !slices.Contains(got, ns+"/victim") {
		t.Fatalf("the kubelet did not prepare the claim before running the pod: prepared %v", got)
	}

	startAgent(t, agentSetup{node: node.Name, gpus: 8, kubeconfig: agentKubeconfigOnNode(t, c, node.Name),
		checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), noExecute: true, scenario: `events:
  - {at: 1s, gpu: 3, xid: 79}
`})

	eventually(t, "victim evicted and gone", func(ctx context.Context) (bool, string, error) {
		got, err := c.Admin().CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "deleted", nil
		}
		if err != nil {
			return false, "", err
		}
		return got.UID != victim.UID, fmt.Sprintf("phase %s, deletionTimestamp %v", got.Status.Phase, got.DeletionTimestamp), nil
	})
	eventually(t, "the kubelet unprepared the claim", func(context.Context) (bool, string, error) {
		got := plugin.Unprepared()
		return slices.Contains(got, ns+"/victim"), fmt.Sprint(got), nil
	})
	eventually(t, "the claim is released", func(ctx context.Context) (bool, string, error) {
		claim, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, "victim", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return len(claim.Status.ReservedFor) == 0 && claim.Status.Allocation == nil,
			fmt.Sprintf("reservedFor %v, allocated %v", claim.Status.ReservedFor, claim.Status.Allocation != nil), nil
	})
}

// TestRealNodeDevicePluginReplicas time-slices each GPU into 4 replicas: the kubelet counts 32
// devices, a sick GPU takes its 4 replicas out, and a pod asking for 2 replicas gets them on two
// different GPUs, each once in its environment.
func TestRealNodeDevicePluginReplicas(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	const ns = "replicas"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	startDevicePlugin(t, node, "events:\n  - {at: 0s, gpu: 3, xid: 79}\n", filepath.Join(t.TempDir(), "ckpt.json"), "--replicas", "4")
	waitGPUs(t, c, node.Name, 32, 28)
	if _, err := c.Admin().CoreV1().Pods(ns).Create(ctx, gpuPod(ns, "shared", node.Name, 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodRunning(t, c, ns, "shared")
	held := podResourcesGPUs(t, node, ns, "shared")
	if len(held) != 2 || !strings.Contains(held[0], "::") {
		t.Fatalf("pod-resources: pod holds %v, want 2 replica IDs", held)
	}
	gpus := map[string]bool{}
	for _, id := range held {
		gpus[strings.Split(id, "::")[0]] = true
	}
	if len(gpus) != 2 || gpus[simUUID(node.Name, 3)] {
		t.Errorf("the 2 replicas are on GPUs %v: want two different healthy GPUs", gpus)
	}
	logs, err := podLogs(ctx, c, ns, "shared")
	if err != nil {
		t.Fatal(err)
	}
	for g := range gpus {
		if strings.Count(logs, g) != 1 {
			t.Errorf("GPU %s should appear once in the container's environment:\n%s", g, logs)
		}
	}
}
