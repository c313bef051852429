// Package fleet judges what the cluster's GPUs have in common when they fail: it reads the
// agents' reports off the Nodes (and the GPU-sharing pods' cards) into the pure judge of
// internal/fleet/sharedcause. `gpuhealth fleet` runs it on demand, the breaker controller every
// minute (internal/fleet/watch).
package fleet

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// The attributes every GPU is grouped by, besides the node labels the caller names.
const (
	// AttributeDriver is the node's driver version, from NVIDIA's GPU feature discovery labels
	// (DriverVersionLabel, or the major, minor and revision labels).
	AttributeDriver = "driver"
	// AttributeModel is the GPU's product name, as its agent reports it.
	AttributeModel = "model"
	// AttributeVBIOS is the GPU's own VBIOS version, as its agent reports it (a bad VBIOS
	// batch fails on every node it was flashed on).
	AttributeVBIOS = "vbios"
	// AttributeNVLinkDomain is the node's NVLink domain (config.DefaultNVLinkDomainLabel).
	AttributeNVLinkDomain = "nvlinkDomain"
	// AttributeZone is the node's zone (corev1.LabelTopologyZone).
	AttributeZone = "zone"
)

// The labels NVIDIA's GPU feature discovery puts on a node for its driver.
const (
	DriverVersionLabel = "nvidia.com/cuda.driver-version.full"
	driverMajorLabel   = "nvidia.com/cuda.driver.major"
	driverMinorLabel   = "nvidia.com/cuda.driver.minor"
	driverRevLabel     = "nvidia.com/cuda.driver.rev"
)

// Collected is what the Nodes and pods say, ready for the judge, and what could not be read.
type Collected struct {
	Fleet sharedcause.Fleet
	// Skipped names the nodes whose report could not be read at all, with why.
	Skipped []string
}

// Collect reads every node's GPUs from its agent's gpu-health annotation: each physical GPU
// (MIG instances and missing GPUs left out) with its attributes (driver, model, VBIOS, NVLink
// domain, zone, and the value of each of labels, under the label's own name) and its faults (faults).
// pods give the workloads: a pod on a node that names its cards (gpuhealthv1's pod keys) belongs
// to its PodGroup or else its controller; a workload is the GPUs of its pods. A pod that names no
// card counts with the GPUs its ResourceClaims hold (CollectHeld).
func Collect(nodes []corev1.Node, pods []corev1.Pod, labels []string) Collected {
	return CollectHeld(nodes, pods, nil, labels)
}

// CollectHeld is Collect with the GPUs pods hold through ResourceClaims (ClaimCards: by
// "namespace/name"), for the pods that name no card.
func CollectHeld(nodes []corev1.Node, pods []corev1.Pod, held map[string][]string, labels []string) Collected {
	ptrs := make([]*corev1.Node, len(nodes))
	for i := range nodes {
		ptrs[i] = &nodes[i]
	}
	var wps []WorkloadPod
	for i := range pods {
		if wp, ok := WorkloadPodOf(&pods[i]); ok {
			wp.ClaimGPUs = held[pods[i].Namespace+"/"+pods[i].Name]
			wps = append(wps, wp)
		}
	}
	return CollectFrom(ptrs, wps, labels)
}

// CollectFrom is Collect from what a cache keeps: the Nodes (CollectedNode keeps enough of
// them) and what WorkloadPodOf reads of the pods.
func CollectFrom(nodes []*corev1.Node, pods []WorkloadPod, labels []string) Collected {
	var out Collected
	cards := map[string]map[int]string{} // node → index → UUID
	for _, n := range nodes {
		v, ok := n.Annotations[gpuhealthv1.HealthKey]
		if !ok {
			continue
		}
		summaries, _, err := gpuhealthv1.ParseHealthEach(v)
		if err != nil {
			out.Skipped = append(out.Skipped, fmt.Sprintf("%s: %v", n.Name, err))
			continue
		}
		attrs := nodeAttributes(n, labels)
		cards[n.Name] = map[int]string{}
		for _, uuid := range slices.Sorted(maps.Keys(summaries)) {
			s := summaries[uuid]
			if s.ParentUUID != "" || s.Missing {
				continue
			}
			cards[n.Name][s.Index] = uuid
			gpu := sharedcause.GPU{UUID: uuid, Node: n.Name, Attributes: map[string]string{AttributeModel: s.Model, AttributeVBIOS: s.VBIOS}}
			for k, v := range attrs {
				gpu.Attributes[k] = v
			}
			out.Fleet.GPUs = append(out.Fleet.GPUs, gpu)
			out.Fleet.Faults = append(out.Fleet.Faults, faults(uuid, s)...)
		}
	}
	out.Fleet.Workloads = workloads(pods, cards)
	return out
}

// CollectedNode returns a copy of n with only what Collect reads of it: its name, the labels of
// its attributes (driver, NVLink domain, zone, and labels) and its gpu-health annotation. A cache
// of every Node keeps it in place of the Node: Collect gives it the same GPUs.
func CollectedNode(n *corev1.Node, labels []string) *corev1.Node {
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}
	keep := func(m map[string]string, key string, into *map[string]string) {
		if v, ok := m[key]; ok {
			if *into == nil {
				*into = map[string]string{}
			}
			(*into)[key] = v
		}
	}
	for _, l := range append([]string{DriverVersionLabel, driverMajorLabel, driverMinorLabel, driverRevLabel,
		config.DefaultNVLinkDomainLabel, corev1.LabelTopologyZone}, labels...) {
		keep(n.Labels, l, &out.Labels)
	}
	keep(n.Annotations, gpuhealthv1.HealthKey, &out.Annotations)
	return out
}

// nodeAttributes returns the attributes a node gives all its GPUs.
func nodeAttributes(n *corev1.Node, labels []string) map[string]string {
	attrs := map[string]string{
		AttributeDriver:       driverVersion(n.Labels),
		AttributeNVLinkDomain: n.Labels[config.DefaultNVLinkDomainLabel],
		AttributeZone:         n.Labels[corev1.LabelTopologyZone],
	}
	for _, l := range labels {
		attrs[l] = n.Labels[l]
	}
	return attrs
}

// driverVersion is the node's driver version as GPU feature discovery labels it; "" when it does
// not.
func driverVersion(labels map[string]string) string {
	if v := labels[DriverVersionLabel]; v != "" {
		return v
	}
	major := labels[driverMajorLabel]
	if major == "" {
		return ""
	}
	parts := []string{major}
	for _, l := range []string{driverMinorLabel, driverRevLabel} {
		if v := labels[l]; v != "" {
			parts = append(parts, v)
		}
	}
	return strings.Join(parts, ".")
}

// faults returns a GPU's faults: those of its recent history (a fault is recorded once per
// repair, for a condition that needs one: not a drain, not a reading that recovers by itself),
// and its own XID faults in effect that the history does not hold (it keeps the newest few
// entries).
func faults(uuid string, s gpuhealthv1.GPUSummary) []sharedcause.Fault {
	var out []sharedcause.Fault
	seen := map[int64]bool{} // to the second: the annotation's times may be rounded
	add := func(at time.Time, reason string) {
		if key := at.Truncate(time.Second).UnixNano(); !seen[key] {
			seen[key] = true
			out = append(out, sharedcause.Fault{GPU: uuid, Time: at, Reason: reason})
		}
	}
	if s.History != nil {
		for _, e := range s.History.Recent {
			if e.Kind == health.HistoryFault {
				add(e.Time, e.Reason)
			}
		}
	}
	for _, x := range s.XIDFaults {
		add(x.Since, fmt.Sprintf("XID%d", x.XID))
	}
	return out
}

// The keys that name a pod's gang: Volcano's and the scheduler-plugins' PodGroup.
var podGroupKeys = []string{"scheduling.k8s.io/group-name", "scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io"}

// WorkloadPod is what Collect reads of a running pod: the workload it belongs to (workloadKey)
// and the card it names on its node, by UUID, or else the cards by index, or else the
// ResourceClaims it uses (of its namespace) and the GPUs they hold (HoldClaims).
type WorkloadPod struct {
	Workload string
	Node     string
	UUID     string
	Cards    []int
	// Namespace and Claims are set for a pod that names no card but uses ResourceClaims.
	Namespace string
	Claims    []string
	// ClaimGPUs are the GPUs its claims hold, once HoldClaims has read them.
	ClaimGPUs []string
}

// WorkloadPodOf returns what Collect reads of p, or false for a pod that gives no workload a GPU:
// not placed, finished, of no workload, or naming no card (or cards that cannot be read) and
// using no ResourceClaim.
func WorkloadPodOf(p *corev1.Pod) (WorkloadPod, bool) {
	if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return WorkloadPod{}, false
	}
	key := workloadKey(p)
	if key == "" {
		return WorkloadPod{}, false
	}
	wp := WorkloadPod{Workload: key, Node: p.Spec.NodeName}
	if u := p.Annotations[gpuhealthv1.PodGPUUUIDKey]; u != "" {
		wp.UUID = u
		return wp, true
	}
	idx, present, ok := gpuhealthv1.ReadPodCards(p.Annotations)
	if !present {
		if wp.Claims = dra.PodClaimNames(p); len(wp.Claims) > 0 {
			wp.Namespace = p.Namespace
			return wp, true
		}
	}
	if !present || !ok || len(idx) == 0 {
		return WorkloadPod{}, false
	}
	wp.Cards = idx
	return wp, true
}

// workloads maps each workload to the GPUs its pods name on their nodes.
func workloads(pods []WorkloadPod, cards map[string]map[int]string) map[string][]string {
	out := map[string][]string{}
	for _, p := range pods {
		for _, uuid := range podGPUs(p, cards[p.Node]) {
			if !slices.Contains(out[p.Workload], uuid) {
				out[p.Workload] = append(out[p.Workload], uuid)
			}
		}
	}
	for k, v := range out {
		if len(v) == 0 {
			delete(out, k)
		}
	}
	return out
}

// workloadKey names the workload a pod belongs to: "podgroup/NS/NAME" for a gang, else
// "KIND/NS/NAME" of its controller; "" for a pod of its own.
func workloadKey(p *corev1.Pod) string {
	for _, k := range podGroupKeys {
		if g := p.Annotations[k]; g != "" {
			return "podgroup/" + p.Namespace + "/" + g
		}
		if g := p.Labels[k]; g != "" {
			return "podgroup/" + p.Namespace + "/" + g
		}
	}
	if ref := metav1.GetControllerOf(p); ref != nil {
		return strings.ToLower(ref.Kind) + "/" + p.Namespace + "/" + ref.Name
	}
	return ""
}

// podGPUs returns the UUIDs of the cards a pod names on its node (by UUID, else by index, else
// those its claims hold).
func podGPUs(p WorkloadPod, cards map[int]string) []string {
	if p.UUID != "" {
		return []string{p.UUID}
	}
	if len(p.Cards) == 0 {
		return p.ClaimGPUs
	}
	var out []string
	for _, i := range p.Cards {
		if u, ok := cards[i]; ok {
			out = append(out, u)
		}
	}
	return out
}
