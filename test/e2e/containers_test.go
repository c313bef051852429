//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	apiv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// imageArchiveEnv names the image archive (OCI, this machine's platform at least) the chart's
// pods run; `make e2e` builds it and sets it. Unset, the test asks make for it.
const imageArchiveEnv = "GPUHEALTH_IMAGE_ARCHIVE"

// chartScenario is what every agent replays: its node field names no real node, so the agents
// only report faults on their own nodes if the pod's node wins. The fault comes late enough
// (8 s after an agent starts) that a restarted agent which reports it within that time can only
// have it from its checkpoint.
const chartScenario = `apiVersion: gpuhealth.dev/v1alpha1
kind: Scenario
node: some-other-node
gpus: {count: 4}
events:
  - {at: 8s, gpu: 1, xid: 79}
`

// faultDelay is the scenario's fault time.
const faultDelay = 8 * time.Second

// TestHelmChartOnContainerdNodes installs the chart as a user would (helm install with
// ci/local-values.yaml and the scenario as agent.sim.scenario) into a cluster whose two nodes run
// containerd, runc and CNI, with the image built here: the agent pods run, turn Ready through
// their /readyz probe, reach the API server through the in-cluster configuration, report the
// scenario's fault on their own nodes (annotation, DeviceTaintRule) and log to where `kubectl
// logs` reads; their device-plugin containers register with the real kubelets, whose
// allocatable drops by the sick GPU. An agent pod deleted mid-fault comes back through the
// DaemonSet with the fault restored from its hostPath checkpoint; a kubelet restart leaves the
// containers running. helm uninstall leaves only what docs/helm.md lists, and stopping the
// cluster leaves no process, shim, mount or cgroup behind.
func TestHelmChartOnContainerdNodes(t *testing.T) {
	skipWithoutContainers(t)
	t.Parallel()
	archive := imageArchive(t)
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 2, Containers: true})
	ctx := t.Context()
	nodes := c.KubeletNodes()
	image := "gpuhealth/gpuhealth:" + chartAppVersion(t)
	for _, n := range nodes {
		chartNode(t, c, n, archive, image)
	}

	scenario := chartScenarioFile(t)
	release := helm.Options{
		Release: "gpuhealth", Namespace: "gpuhealth-system",
		Values:  []string{"deployments/helm/gpuhealth/ci/local-values.yaml"},
		SetFile: []string{"agent.sim.scenario=" + scenario},
		Set:     []string{"agent.devicePlugin.enabled=true"},
	}
	installed := time.Now()
	if out, err := helm.Install(ctx, c.AdminKubeconfig(), release, "3m"); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	t.Logf("helm install --wait returned after %s", time.Since(installed).Round(10*time.Millisecond))
	const ns = "gpuhealth-system"
	selector := labels.Set{"app.kubernetes.io/instance": "gpuhealth", "app.kubernetes.io/component": "agent"}.String()

	agents := map[string]*corev1.Pod{}
	t.Run("agent pods run and turn Ready on every node", func(t *testing.T) {
		eventually(t, "an agent pod Ready on each node", func(ctx context.Context) (bool, string, error) {
			pods, err := c.Admin().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return false, "", err
			}
			clear(agents)
			var states []string
			for i := range pods.Items {
				p := &pods.Items[i]
				states = append(states, fmt.Sprintf("%s on %s: %s ready=%v", p.Name, p.Spec.NodeName, p.Status.Phase, podReady(p)))
				if podReady(p) && p.DeletionTimestamp == nil {
					agents[p.Spec.NodeName] = p
				}
			}
			return len(agents) == len(nodes), strings.Join(states, "; "), nil
		})
		t.Logf("agents Ready %s after helm install started", time.Since(installed).Round(10*time.Millisecond))
		for _, n := range nodes {
			p := agents[n.Name]
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if err != nil || !n.PodCIDR().Contains(ip) {
				t.Errorf("pod %s on %s has IP %q, want one in the node's pod subnet %s", p.Name, n.Name, p.Status.PodIP, n.PodCIDR())
			}
			if p.Spec.HostNetwork {
				t.Errorf("pod %s runs in the host network; the test must prove the pod network reaches the API server", p.Name)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("each agent reports the fault on its own node", func(t *testing.T) {
		for _, n := range nodes {
			waitNodeFault(t, c, n.Name)
			waitTaintRule(t, c, n.Name)
		}
	})

	t.Run("the device plugin takes the sick GPU out of the kubelet's allocatable", func(t *testing.T) {
		for _, n := range nodes {
			waitGPUs(t, c, n.Name, 4, 3)
		}
	})

	t.Run("kubectl logs shows the agents' logs", func(t *testing.T) {
		for _, n := range nodes {
			p := agents[n.Name]
			out, err := exec.CommandContext(ctx, filepath.Join(c.BinDir(), controlplane.BinKubectl),
				"--kubeconfig", c.AdminKubeconfig(), "logs", "-n", ns, p.Name, "-c", "agent").CombinedOutput()
			if err != nil {
				t.Fatalf("kubectl logs %s: %v\n%s", p.Name, err, out)
			}
			for _, want := range []string{`"msg":"Replaying the scenario on this node"`, `"node":"` + n.Name + `"`, `"reason":"XID79"`} {
				if !strings.Contains(string(out), want) {
					t.Errorf("logs of %s lack %s:\n%s", p.Name, want, out)
				}
			}
		}
	})

	t.Run("a deleted agent comes back with the fault from its checkpoint", func(t *testing.T) {
		n := nodes[0]
		old := agents[n.Name]
		checkpoint := filepath.Join(n.RootFS(), "var", "lib", "gpuhealth", "checkpoint.json")
		if data, err := os.ReadFile(checkpoint); err != nil || !strings.Contains(string(data), simUUID(n.Name, 1)) {
			t.Fatalf("the agent's hostPath checkpoint on %s (%s) does not hold the fault: %v\n%s", n.Name, checkpoint, err, data)
		}
		// Watch the annotation from before the deletion until the new agent has run past the
		// scenario's fault time: it must never lose the fault.
		watchCtx, stopWatch := context.WithCancel(ctx)
		var lost []string
		var watched sync.WaitGroup
		watched.Go(func() {
			for watchCtx.Err() == nil {
				ann, err := nodeAnnotations(watchCtx, c, n.Name)
				if err == nil && ann[apiv1.UnhealthyIDsKey] != "1" {
					lost = append(lost, fmt.Sprintf("%s: %s=%q", time.Now().Format(time.StampMilli), apiv1.UnhealthyIDsKey, ann[apiv1.UnhealthyIDsKey]))
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
		if err := c.Admin().CoreV1().Pods(ns).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var successor *corev1.Pod
		eventuallyWithin(t, 2*pollTimeout, "a new Ready agent on "+n.Name, func(ctx context.Context) (bool, string, error) {
			pods, err := c.Admin().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return false, "", err
			}
			var states []string
			for i := range pods.Items {
				p := &pods.Items[i]
				states = append(states, fmt.Sprintf("%s on %s ready=%v", p.Name, p.Spec.NodeName, podReady(p)))
				if p.Spec.NodeName == n.Name && p.UID != old.UID && podReady(p) {
					successor = p
				}
			}
			return successor != nil, strings.Join(states, "; "), nil
		})
		started := containerStarted(successor)
		if wait := time.Until(started.Add(faultDelay + 2*time.Second)); wait > 0 {
			time.Sleep(wait)
		}
		stopWatch()
		watched.Wait()
		if len(lost) > 0 {
			t.Errorf("the node lost the fault while its agent was replaced: %v", lost)
		}
		b, err := c.Admin().CoreV1().Pods(ns).GetLogs(successor.Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
		logs := string(b)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logs, `"msg":"Restored the checkpoint"`) {
			t.Errorf("the new agent %s did not restore the hostPath checkpoint:\n%s", successor.Name, logs)
		}
	})

	t.Run("a kubelet restart leaves the agent running", func(t *testing.T) {
		n := nodes[1]
		before := agents[n.Name]
		if err := c.RestartKubelet(ctx, n.Name); err != nil {
			t.Fatal(err)
		}
		// A starting kubelet deletes its node's ResourceSlices of DRA drivers that have not
		// registered with it (here all, as no driver runs): waiting for that proves the new kubelet
		// is at work. A driver would publish them again; the agent then taints the sick GPU's
		// device again.
		sliceClient := c.Admin().ResourceV1().ResourceSlices()
		eventually(t, "the restarted kubelet to delete the unregistered driver's ResourceSlice", func(ctx context.Context) (bool, string, error) {
			_, err := sliceClient.Get(ctx, controlplane.GPUResourceSlice(n.Name).Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, "", nil
			}
			return false, "still there", err
		})
		uuids := []string{simUUID(n.Name, 0), simUUID(n.Name, 1), simUUID(n.Name, 2), simUUID(n.Name, 3)}
		if _, err := sliceClient.Create(ctx, controlplane.GPUResourceSlice(n.Name, uuids...), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitTaintRule(t, c, n.Name)
		p, err := c.Admin().CoreV1().Pods(ns).Get(ctx, before.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.RestartCount > 0 || s.State.Running == nil {
				t.Errorf("container %s of the agent pod after the kubelet restart: %d restarts, state %+v", s.Name, s.RestartCount, s.State)
			}
		}
		if p.UID != before.UID || !podReady(p) {
			t.Errorf("agent pod %s not the same Ready pod after the kubelet restart (ready=%v)", p.Name, podReady(p))
		}
	})

	t.Run("helm uninstall leaves only what docs/helm.md lists", func(t *testing.T) {
		if out, err := helm.Uninstall(ctx, c.AdminKubeconfig(), release, "2m"); err != nil {
			t.Fatalf("helm uninstall: %v\n%s", err, out)
		}
		eventually(t, "agent pods gone", func(ctx context.Context) (bool, string, error) {
			pods, err := c.Admin().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, "", err
			}
			return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items)), nil
		})
		// Every object the release rendered is gone.
		if left := existingObjects(t, c, renderChart(t, release)); len(left) > 0 {
			t.Errorf("the release left objects behind: %v", left)
		}
		// What docs/helm.md ("Uninstalling") says stays, and why: the agents' last report, which a
		// stopping agent must not withdraw.
		for _, n := range nodes {
			ann, err := nodeAnnotations(ctx, c, n.Name)
			if err != nil {
				t.Fatal(err)
			}
			if ann[apiv1.UnhealthyIDsKey] != "1" || ann[apiv1.HealthKey] == "" {
				t.Errorf("node %s annotations after uninstall: %v; docs/helm.md says they stay until deleted", n.Name, ann)
			}
		}
		rules, err := c.Admin().ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: devicetaint.NodeLabel})
		if err != nil {
			t.Fatal(err)
		}
		if len(rules.Items) != len(nodes) {
			t.Errorf("%d DeviceTaintRules after uninstall, want the %d docs/helm.md says stay", len(rules.Items), len(nodes))
		}
		// The cleanup docs/helm.md gives works.
		if err := c.Admin().ResourceV1().DeviceTaintRules().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: devicetaint.NodeLabel}); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null,%q:null}}}`, apiv1.UnhealthyIDsKey, apiv1.HealthKey, apiv1.VolcanoStateKey)
			if _, err := c.Admin().CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("stopping the cluster leaves nothing behind", func(t *testing.T) {
		var containerIDs []string
		for _, p := range agents {
			for _, s := range p.Status.ContainerStatuses {
				containerIDs = append(containerIDs, strings.TrimPrefix(s.ContainerID, "containerd://"))
			}
		}
		var pids []int
		for _, p := range c.Processes() {
			pids = append(pids, p.PID)
		}
		var sockets []string
		for _, n := range nodes {
			sockets = append(sockets, n.CRISocket())
		}
		// The checks below look for these by their shims' command lines and by cgroup: make sure
		// they find them while the pods run, or their finding nothing afterwards proves nothing.
		if _, err := c.Admin().CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "sleeper"},
			Spec: corev1.PodSpec{
				NodeName:   nodes[0].Name,
				Containers: []corev1.Container{{Name: "pause", Image: controlplane.PauseImage, ImagePullPolicy: corev1.PullNever}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		sleeper := waitPodRunning(t, c, "default", "sleeper")
		id := strings.TrimPrefix(sleeper.Status.ContainerStatuses[0].ContainerID, "containerd://")
		containerIDs = append(containerIDs, id)
		if found, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io/" + id); len(found) == 0 {
			t.Errorf("no cgroup of the running container %.12s under /sys/fs/cgroup/*/k8s.io", id)
		}
		if len(controlplane.ShimPIDs(nodes[0].CRISocket())) == 0 {
			t.Errorf("no shim of %s found while a pod runs there", nodes[0].Name)
		}
		dir := c.Dir()
		stopped := time.Now()
		if err := c.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("cluster stopped in %s", time.Since(stopped).Round(10*time.Millisecond))
		for _, pid := range pids {
			if err := syscall.Kill(pid, 0); err == nil {
				t.Errorf("pid %d still runs", pid)
			}
		}
		for _, s := range sockets {
			if pids := controlplane.ShimPIDs(s); len(pids) > 0 {
				t.Errorf("shims %v of %s still run", pids, s)
			}
		}
		if m := mountsUnder(t, dir); len(m) > 0 {
			t.Errorf("mounts left under %s: %v", dir, m)
		}
		for _, id := range containerIDs {
			if found, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io/" + id); len(found) > 0 {
				t.Errorf("cgroups of container %.12s left: %v", id, found)
			}
		}
		out, err := exec.CommandContext(ctx, "ip", "-o", "link").CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		if regexp.MustCompile(`gh-br\d`).Match(out) {
			t.Errorf("a node bridge is in the machine's network namespace:\n%s", out)
		}
	})
}

// startContainerdNode starts a cluster with one containerd node (or skips the test where
// containers cannot run) and imports the gpuhealth image, whose name it returns with the node.
func startContainerdNode(t *testing.T) (*controlplane.Cluster, *controlplane.KubeletNode, string) {
	t.Helper()
	archive := imageArchive(t)
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1, Containers: true})
	n := c.KubeletNodes()[0]
	image := "gpuhealth/gpuhealth:" + chartAppVersion(t)
	if err := n.ImportImage(t.Context(), archive, image); err != nil {
		t.Fatal(err)
	}
	return c, n, image
}

// skipWithoutContainers skips the test where this machine cannot run containers.
// chartNode readies a kubelet node for the chart: the image imported into its containerd, and
// a ResourceSlice of the 4 GPUs chartScenario simulates there.
func chartNode(t *testing.T, c *controlplane.Cluster, n *controlplane.KubeletNode, archive, image string) {
	t.Helper()
	start := time.Now()
	if err := n.ImportImage(t.Context(), archive, image); err != nil {
		t.Fatal(err)
	}
	t.Logf("imported %s into %s in %s", image, n.Name, time.Since(start).Round(10*time.Millisecond))
	uuids := make([]string, 4)
	for i := range uuids {
		uuids[i] = simUUID(n.Name, i)
	}
	if _, err := c.Admin().ResourceV1().ResourceSlices().Create(t.Context(), controlplane.GPUResourceSlice(n.Name, uuids...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// chartScenarioFile writes chartScenario to a file for agent.sim.scenario.
func chartScenarioFile(t *testing.T) string {
	t.Helper()
	scenario := filepath.Join(t.TempDir(), "scenario.yaml")
	if err := os.WriteFile(scenario, []byte(chartScenario), 0o600); err != nil {
		t.Fatal(err)
	}
	return scenario
}

func skipWithoutContainers(t *testing.T) {
	t.Helper()
	if err := controlplane.CanRunContainers(); err != nil {
		t.Skipf("skipping: this machine cannot run containers: %v", err)
	}
}

// imageArchive returns the gpuhealth image archive: $GPUHEALTH_IMAGE_ARCHIVE, or the one
// `make bin/gpuhealth-image.tar` builds (for this machine's architecture) when it is stale.
func imageArchive(t *testing.T) string {
	t.Helper()
	if path := os.Getenv(imageArchiveEnv); path != "" {
		return path
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "make", "--no-print-directory", "-C", root, "bin/gpuhealth-image.tar")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the image (%s unset): %v\n%s", imageArchiveEnv, err, out)
	}
	return filepath.Join(root, "bin", "gpuhealth-image.tar")
}

// chartAppVersion is the chart's appVersion, the image tag it runs by default.
func chartAppVersion(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, helm.ChartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	return string(m[1])
}

// waitTaintRule waits until the node's only DeviceTaintRule is the agent's for GPU 1 (the
// scenario's fault), selecting that GPU's device in the node's pool.
func waitTaintRule(t *testing.T, c *controlplane.Cluster, node string) {
	t.Helper()
	uuid := simUUID(node, 1)
	eventually(t, "DeviceTaintRule for "+uuid, func(ctx context.Context) (bool, string, error) {
		rules, err := c.Admin().ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{
			LabelSelector: labels.Set{devicetaint.NodeLabel: node}.String()})
		if err != nil {
			return false, "", err
		}
		var seen []string
		for _, r := range rules.Items {
			seen = append(seen, fmt.Sprintf("%s %s=%s %s", r.Name, devicetaint.UUIDLabel, r.Labels[devicetaint.UUIDLabel], r.Spec.Taint.Effect))
			if r.Labels[devicetaint.UUIDLabel] == uuid && r.Spec.DeviceSelector != nil &&
				r.Spec.DeviceSelector.Pool != nil && *r.Spec.DeviceSelector.Pool == node &&
				r.Spec.DeviceSelector.Device != nil && *r.Spec.DeviceSelector.Device == controlplane.GPUDeviceName(1) {
				return len(rules.Items) == 1, strings.Join(seen, "; "), nil
			}
		}
		return false, strings.Join(seen, "; "), nil
	})
}

// waitNodeFault waits until the node's Volcano annotation names GPU 1 (the scenario's fault).
func waitNodeFault(t *testing.T, c *controlplane.Cluster, node string) {
	t.Helper()
	eventuallyWithin(t, pollTimeout+faultDelay, "GPU 1 unhealthy on "+node, func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		return ann[apiv1.UnhealthyIDsKey] == "1", fmt.Sprintf("%s=%q", apiv1.UnhealthyIDsKey, ann[apiv1.UnhealthyIDsKey]), nil
	})
}

func podReady(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// containerStarted is when the pod's (first) container started.
func containerStarted(p *corev1.Pod) time.Time {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running != nil {
			return s.State.Running.StartedAt.Time
		}
	}
	return time.Now()
}

// existingObjects returns kind/namespace/name of each object of the rendered manifest that the
// API server still has.
func existingObjects(t *testing.T, c *controlplane.Cluster, manifest string) []string {
	t.Helper()
	objs, dyn, mapper := manifestClients(t, c, manifest)
	var left []string
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		_, err = ri.Get(t.Context(), obj.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			t.Errorf("get %s %s: %v", gvk.Kind, obj.GetName(), err)
		default:
			left = append(left, fmt.Sprintf("%s %s/%s", gvk.Kind, obj.GetNamespace(), obj.GetName()))
		}
	}
	return left
}
