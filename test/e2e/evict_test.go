//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestEvictionOnARealNode runs agent.eviction against a real kubelet and the real
// controller-manager's disruption controller. Three device-plugin pods hold one healthy GPU each
// (the kubelet chose which; the pod-resources API says): two of those GPUs fall off the bus
// (XID 79, which asks for eviction), and so does card 3, which a Volcano gpushare pod holds by
// its annotation alone. The agent evicts, through the Eviction API, the victim and the Volcano
// pod, each with an Event on the pod and the Node; the pod a PodDisruptionBudget covers stays,
// refused (429) and retried, until the budget is relaxed, then leaves too; the pods on healthy
// GPUs (a device-plugin pod and a Volcano pod on another card) keep running. A DRA pod on a lost
// GPU is evicted once, by the controller-manager's device-taint controller (the agent taints the
// device NoExecute), never by the agent.
func TestEvictionOnARealNode(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1,
		Controllers: append(controlplane.DefaultControllers(), "node-lifecycle-controller", "disruption-controller")})
	ctx := t.Context()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	const ns = "evict"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// The device plugin's own simulation leaves GPUs 0-2 healthy: the three pods get one each.
	var sick strings.Builder
	for i := 3; i < 8; i++ {
		fmt.Fprintf(&sick, "  - {at: 0s, gpu: %d, xid: 79}\n", i)
	}
	startDevicePlugin(t, node, "events:\n"+sick.String(), filepath.Join(t.TempDir(), "dp.json"))
	waitGPUs(t, c, node.Name, 8, 3)

	gpuOf := map[string]int{}
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"victim", "protected", "bystander"} {
		pod := gpuPod(ns, name, node.Name, 1)
		pod.Labels = map[string]string{"app": name}
		if _, err := c.Admin().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"victim", "protected", "bystander"} {
		pods[name] = waitPodRunning(t, c, ns, name)
		held := podResourcesGPUs(t, node, ns, name)
		if len(held) != 1 || gpuIndex(node.Name, held[0]) < 0 || gpuIndex(node.Name, held[0]) > 2 {
			t.Fatalf("pod-resources: %s holds %v, want one of GPUs 0-2", name, held)
		}
		gpuOf[name] = gpuIndex(node.Name, held[0])
	}
	// Volcano's gpushare pods ask for no device-plugin GPU: the card is in the annotation.
	volcanoPod := func(name string, card int) {
		pod := plainPod(ns, name, node.Name)
		pod.Annotations = map[string]string{scheduling.GPUIndexAnnotation: strconv.Itoa(card)}
		if _, err := c.Admin().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[name] = waitPodRunning(t, c, ns, name)
	}
	volcanoPod("shared", 3)
	volcanoPod("shared-healthy", gpuOf["bystander"])
	// GPU 4 is held through DRA: the node's DRA plugin prepares the claim.
	uuids, _ := realGPUNode(t, c, node.Name, 8)
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podWithClaim(t, c, pinnedClaim(ns, "dra", uuids[4], ""), node.Name)
	pods["dra"] = waitPodRunning(t, c, ns, "dra")

	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "protected"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptrIntOrString(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "protected"}},
		},
	}
	if _, err := c.Admin().PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPDB(t, c, ns, pdb.Name, 0)

	kubeconfig := agentKubeconfigOnNode(t, c, node.Name)
	evictionRBAC(t, c)
	startAgent(t, agentSetup{node: node.Name, gpus: 8, kubeconfig: kubeconfig,
		checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), topConfig: evictionConfig(node.PodResourcesSocket()), noExecute: true,
		scenario: fmt.Sprintf("events:\n  - {at: 1s, gpu: %d, xid: 79}\n  - {at: 1s, gpu: %d, xid: 79}\n  - {at: 1s, gpu: 3, xid: 79}\n  - {at: 1s, gpu: 4, xid: 79}\n",
			gpuOf["victim"], gpuOf["protected"])})
	t.Cleanup(func() {
		if t.Failed() {
			dumpEvictionState(t, c, ns, node.Name)
		}
	})

	t.Run("the device-plugin pod of the lost GPU is evicted, with an Event on the pod and the Node", func(t *testing.T) {
		waitPodGone(t, c, ns, "victim", pods["victim"].UID)
		want := fmt.Sprintf("GPU %d (%s) through device-plugin", gpuOf["victim"], simUUID(node.Name, gpuOf["victim"]))
		waitEvent(t, c, ns, "victim", "GPUEvicted", want)
		waitEvent(t, c, "default", node.Name, "GPUEvicted", "pod "+ns+"/victim evicted: it holds "+want)
	})

	t.Run("the Volcano pod is evicted by its card", func(t *testing.T) {
		waitPodGone(t, c, ns, "shared", pods["shared"].UID)
		want := fmt.Sprintf("GPU 3 (%s) through volcano", simUUID(node.Name, 3))
		waitEvent(t, c, ns, "shared", "GPUEvicted", want)
		waitEvent(t, c, "default", node.Name, "GPUEvicted", "pod "+ns+"/shared evicted: it holds "+want)
	})

	t.Run("the PodDisruptionBudget holds the pod back until it is relaxed", func(t *testing.T) {
		uuid := simUUID(node.Name, gpuOf["protected"])
		// The Eviction API refused (429): the pod stays, and the Node lists it as blocked.
		waitEvent(t, c, ns, "protected", "GPUEvictionBlocked", "disruption budget")
		eventually(t, "the Node lists the protected pod as Blocked", func(ctx context.Context) (bool, string, error) {
			p, err := pendingEvictions(ctx, c, node.Name)
			g := p[uuid]
			ok := slices.ContainsFunc(g.Pods, func(e gpuhealthv1.PodEviction) bool {
				return e.Pod == ns+"/protected" && e.State == gpuhealthv1.EvictionBlocked
			})
			return ok, fmt.Sprintf("%+v", p), err
		})
		assertPodUntouched(t, c, pods["protected"])

		// Relax the budget: once the disruption controller allows one disruption, the agent's
		// next retry evicts.
		got, err := c.Admin().PolicyV1().PodDisruptionBudgets(ns).Get(ctx, pdb.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Spec.MinAvailable = ptrIntOrString(intstr.FromInt32(0))
		if _, err := c.Admin().PolicyV1().PodDisruptionBudgets(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, c, ns, "protected", pods["protected"].UID)
		waitEvent(t, c, ns, "protected", "GPUEvicted", fmt.Sprintf("GPU %d (%s) through device-plugin", gpuOf["protected"], uuid))
		eventually(t, "nothing pending on the Node", func(ctx context.Context) (bool, string, error) {
			p, err := pendingEvictions(ctx, c, node.Name)
			return len(p) == 0, fmt.Sprintf("%+v", p), err
		})
	})

	t.Run("the DRA pod is evicted once, by the device-taint controller, never by the agent", func(t *testing.T) {
		waitEvent(t, c, ns, "dra", "DeviceTaintManagerEviction", "")
		waitPodGone(t, c, ns, "dra", pods["dra"].UID)
		// The agent's rounds above all looked at GPU 4 too: it never found the DRA pod there.
		if msgs, err := evictionEvents(ctx, c, ns, "dra", "GPUEvicted"); err != nil || len(msgs) > 0 {
			t.Errorf("the agent evicted the DRA pod as well: %v (%v)", msgs, err)
		}
		if msgs, err := evictionEvents(ctx, c, ns, "dra", "DeviceTaintManagerEviction"); err != nil || len(msgs) != 1 {
			t.Errorf("device-taint controller evictions of the DRA pod: %v (%v), want one", msgs, err)
		}
	})

	t.Run("the pods on healthy GPUs keep running", func(t *testing.T) {
		// Every round above looked at every sick GPU: these pods were never among their holders.
		assertPodUntouched(t, c, pods["bystander"])
		assertPodUntouched(t, c, pods["shared-healthy"])
	})
}

// TestEvictionWithoutPodResourcesEvictsNothing: when the kubelet's pod-resources socket cannot
// be reached, the agent does not know who holds a lost GPU, so it evicts nobody (neither the
// device-plugin pod nor the Volcano pod on that card) and a Warning Event on the Node says why.
func TestEvictionWithoutPodResourcesEvictsNothing(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	const ns = "evict-unknown"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	var sick strings.Builder
	for i := 1; i < 8; i++ {
		fmt.Fprintf(&sick, "  - {at: 0s, gpu: %d, xid: 79}\n", i)
	}
	startDevicePlugin(t, node, "events:\n"+sick.String(), filepath.Join(t.TempDir(), "dp.json"))
	waitGPUs(t, c, node.Name, 8, 1)
	if _, err := c.Admin().CoreV1().Pods(ns).Create(ctx, gpuPod(ns, "holder", node.Name, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	holder := waitPodRunning(t, c, ns, "holder")
	if held := podResourcesGPUs(t, node, ns, "holder"); !slices.Equal(held, []string{simUUID(node.Name, 0)}) {
		t.Fatalf("pod-resources: holder holds %v, want GPU 0", held)
	}
	shared := plainPod(ns, "shared", node.Name)
	shared.Annotations = map[string]string{scheduling.GPUIndexAnnotation: "0"}
	if _, err := c.Admin().CoreV1().Pods(ns).Create(ctx, shared, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sharedPod := waitPodRunning(t, c, ns, "shared")

	// Nothing listens there.
	socket := filepath.Join(t.TempDir(), "pod-resources", "kubelet.sock")
	kubeconfig := agentKubeconfigOnNode(t, c, node.Name)
	evictionRBAC(t, c)
	agent := startAgent(t, agentSetup{node: node.Name, gpus: 8, kubeconfig: kubeconfig,
		checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), topConfig: evictionConfig(socket),
		scenario: "events:\n  - {at: 1s, gpu: 0, xid: 79}\n"})
	t.Cleanup(func() {
		if t.Failed() {
			dumpEvictionState(t, c, ns, node.Name)
		}
	})

	msg := waitEvent(t, c, "default", node.Name, "GPUEvictionUnknown", socket)
	if !strings.Contains(msg, "none is evicted") {
		t.Errorf("the Event does not say that nothing is evicted: %q", msg)
	}
	// Several rounds later (one a second), still nobody evicted.
	eventually(t, "three rounds without knowing", func(ctx context.Context) (bool, string, error) {
		b, err := os.ReadFile(agent.log)
		n := strings.Count(string(b), "Cannot tell which pods hold the GPU")
		return n >= 3, fmt.Sprintf("%d rounds", n), err
	})
	assertPodUntouched(t, c, holder)
	assertPodUntouched(t, c, sharedPod)
	if p, err := pendingEvictions(ctx, c, node.Name); err != nil || len(p) > 0 {
		t.Errorf("pending evictions %+v (%v), want none: nothing is known to hold the GPU", p, err)
	}
}

func ptrIntOrString(v intstr.IntOrString) *intstr.IntOrString { return &v }

// waitPDB waits until the disruption controller has seen the budget's current generation and
// allows that many disruptions.
func waitPDB(t *testing.T, c *controlplane.Cluster, ns, name string, allowed int32) {
	t.Helper()
	eventually(t, fmt.Sprintf("PDB %s/%s observed, %d disruptions allowed", ns, name, allowed), func(ctx context.Context) (bool, string, error) {
		p, err := c.Admin().PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return p.Status.ObservedGeneration == p.Generation && p.Status.DisruptionsAllowed == allowed && p.Status.ExpectedPods > 0,
			fmt.Sprintf("%+v", p.Status), nil
	})
}

// dumpEvictionState logs the namespace's pods, the Events about them and the Node, and the
// Node's pending evictions, when a test fails.
func dumpEvictionState(t *testing.T, c *controlplane.Cluster, ns, node string) {
	ctx := context.WithoutCancel(t.Context())
	if pods, err := c.Admin().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			t.Logf("pod %s/%s uid %s phase %s deleting %v", p.Namespace, p.Name, p.UID, p.Status.Phase, p.DeletionTimestamp != nil)
		}
	}
	for _, where := range []string{ns, "default"} {
		if evs, err := c.Admin().CoreV1().Events(where).List(ctx, metav1.ListOptions{}); err == nil {
			for _, e := range evs.Items {
				if e.Source.Component == "gpuhealth-agent" || strings.HasPrefix(e.Reason, "GPUEvict") {
					t.Logf("event %s %s/%s %s x%d: %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Count, e.Message)
				}
			}
		}
	}
	p, err := pendingEvictions(ctx, c, node)
	t.Logf("pending evictions on %s: %+v (%v)", node, p, err)
}

// TestEvictionReplacementLandsOnAHealthyNode: a Deployment's pod holds the only healthy GPU of
// one real node; the GPU falls off the bus (the node's device plugin and agent both see it). The
// agent evicts the pod, and the Deployment's replacement lands on a healthy GPU of the other
// node, as the kubelets' pod-resources APIs show.
func TestEvictionReplacementLandsOnAHealthyNode(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 2})
	ctx := t.Context()
	sick, healthy := c.KubeletNode(controlplane.KubeletNodeName(0)), c.KubeletNode(controlplane.KubeletNodeName(1))
	const ns = "evict-deploy"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	faults := func(from int) string {
		var b strings.Builder
		b.WriteString("events:\n")
		for i := from; i < 8; i++ {
			fmt.Fprintf(&b, "  - {at: 0s, gpu: %d, xid: 79}\n", i)
		}
		return b.String()
	}
	// Only GPU 0 of the first node is healthy, and the second node has no GPUs yet: the
	// Deployment's pod can only land on that GPU.
	plugin := startDevicePlugin(t, sick, faults(1), filepath.Join(t.TempDir(), "dp.json"))
	waitGPUs(t, c, sick.Name, 8, 1)
	labels := map[string]string{"app": "trainer"}
	template := gpuPod(ns, "", "", 1)
	template.Spec.NodeSelector = nil
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "trainer"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: template.Spec},
		},
	}
	if _, err := c.Admin().AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitDeploymentPod(t, c, ns, labels, "")
	if first.Spec.NodeName != sick.Name {
		t.Fatalf("the Deployment's pod runs on %s, want %s", first.Spec.NodeName, sick.Name)
	}
	if held := podResourcesGPUs(t, sick, ns, first.Name); !slices.Equal(held, []string{simUUID(sick.Name, 0)}) {
		t.Fatalf("pod-resources: %s holds %v, want GPU 0 of %s", first.Name, held, sick.Name)
	}

	// GPU 0 falls off the bus. The node's device plugin sees it too (restarted with the fault,
	// as after the driver lost the GPU), so the kubelet has no healthy GPU left to give.
	plugin.stop(t)
	waitGPUs(t, c, sick.Name, 8, 0)
	after := startDevicePlugin(t, sick, faults(0), filepath.Join(t.TempDir(), "dp-after.json"))
	startDevicePlugin(t, healthy, "events: []\n", filepath.Join(t.TempDir(), "dp-healthy.json"))
	waitGPUs(t, c, healthy.Name, 8, 8)
	eventually(t, "the restarted device plugin registered", func(context.Context) (bool, string, error) {
		b, err := os.ReadFile(after.log)
		return strings.Contains(string(b), "Registered with the kubelet"), "", err
	})
	waitGPUs(t, c, sick.Name, 8, 0)
	assertPodUntouched(t, c, first) // the kubelet moves no running pod off an Unhealthy device

	kubeconfig := agentKubeconfigOnNode(t, c, sick.Name)
	evictionRBAC(t, c)
	startAgent(t, agentSetup{node: sick.Name, gpus: 8, kubeconfig: kubeconfig,
		checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), topConfig: evictionConfig(sick.PodResourcesSocket()),
		scenario: "events:\n  - {at: 1s, gpu: 0, xid: 79}\n"})
	t.Cleanup(func() {
		if t.Failed() {
			dumpEvictionState(t, c, ns, sick.Name)
		}
	})

	waitPodGone(t, c, ns, first.Name, first.UID)
	waitEvent(t, c, ns, first.Name, "GPUEvicted", fmt.Sprintf("GPU 0 (%s) through device-plugin", simUUID(sick.Name, 0)))
	next := waitDeploymentPod(t, c, ns, labels, first.UID)
	if next.Spec.NodeName != healthy.Name {
		t.Fatalf("the replacement %s runs on %s, want %s", next.Name, next.Spec.NodeName, healthy.Name)
	}
	held := podResourcesGPUs(t, healthy, ns, next.Name)
	if len(held) != 1 || gpuIndex(healthy.Name, held[0]) < 0 {
		t.Fatalf("pod-resources of %s: the replacement holds %v, want one of its GPUs", healthy.Name, held)
	}
}

// waitDeploymentPod waits for a Running pod of the Deployment (by its labels) other than the
// one with UID not, and returns it.
func waitDeploymentPod(t *testing.T, c *controlplane.Cluster, ns string, labels map[string]string, not types.UID) *corev1.Pod {
	t.Helper()
	var found *corev1.Pod
	eventually(t, "a Running pod of the Deployment", func(ctx context.Context) (bool, string, error) {
		list, err := c.Admin().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: labels})})
		if err != nil {
			return false, "", err
		}
		var seen []string
		for i := range list.Items {
			p := &list.Items[i]
			seen = append(seen, fmt.Sprintf("%s on %q %s", p.Name, p.Spec.NodeName, p.Status.Phase))
			if p.UID != not && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				found = p
				return true, "", nil
			}
		}
		return false, fmt.Sprint(seen), nil
	})
	return found
}
