// Package scheduling is the placement logic of gpuhealth's scheduler extender: it reads the GPU
// health the agent writes on a Node (the volcano.sh/gpu-unhealthy-ids, gpuhealth.dev/gpu-health
// and gpuhealth.dev/gpu-drains annotations, and HAMi's hami.io/device-cordon; ParseNode) and
// decides whether a pod's GPU request fits a node, which card a GPU-sharing pod should get, and
// how good a node is for it. Judge is the whole verdict a filter gives on one node: a stale
// report, the fit and its reason, and whether GPU health is to blame (the pod is worth retrying
// when the node gets better: Improved).
//
// Everything here is pure: no HTTP, no API client, no clock (the caller says what time it is),
// no logging. Parsing never fails and
// never panics on what it reads from the cluster; entries it cannot use are skipped and returned
// as warnings for the caller to log, and the rest still count. The HTTP extender
// (internal/scheduling/extender) decodes requests, calls this package and encodes the answers.
package scheduling

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Resource and annotation names of the device-plugin and Volcano GPU-sharing paths.
const (
	// ResourceGPU is the whole-GPU extended resource of NVIDIA's device plugin.
	ResourceGPU corev1.ResourceName = "nvidia.com/gpu"
	// ResourceGPUMemory is Volcano's GPU-sharing resource: on a pod, the MiB it needs on one
	// card; on a node, the MiB of all its cards together.
	ResourceGPUMemory corev1.ResourceName = "volcano.sh/gpu-memory"
	// ResourceGPUNumber is, on a node, how many cards share ResourceGPUMemory.
	ResourceGPUNumber corev1.ResourceName = "volcano.sh/gpu-number"

	// GPUIndexAnnotation and GPUUUIDAnnotation name a GPU-sharing pod's card: the wire
	// package's PodGPUIndexKey and PodGPUUUIDKey (gpuhealthv1.ReadPodCards reads them).
	GPUIndexAnnotation = gpuhealthv1.PodGPUIndexKey
	GPUUUIDAnnotation  = gpuhealthv1.PodGPUUUIDKey
)

// MaxGPUsPerNode bounds the GPU count read from a node's capacity (gpuhealthv1.MaxGPUsPerNode).
const MaxGPUsPerNode = gpuhealthv1.MaxGPUsPerNode

// maxWarnings bounds the warnings one annotation produces; a 256 KiB annotation of garbage must
// not turn into 100,000 log lines.
const maxWarnings = 8

// GPU is one physical card of a node.
type GPU struct {
	Index int
	// UUID comes from the gpu-health annotation; empty when it does not list the card.
	UUID string
	// Health is Healthy, Degraded (filters keep the card, scores avoid it) or Unhealthy (never
	// given to a pod; drained cards too).
	Health health.Severity
	// Drained is set when an administrator drained the card; Health is then Unhealthy too.
	Drained bool
}

// NodeGPUs is the scheduler's view of one node's GPUs.
type NodeGPUs struct {
	Name string
	// WholeGPUs is the node's nvidia.com/gpu capacity (0 when it has none).
	WholeGPUs int
	// Cards and MemoryPerCard (MiB) describe Volcano GPU sharing (volcano.sh/gpu-number and
	// volcano.sh/gpu-memory ÷ gpu-number); both 0 when the node does not share GPUs.
	Cards         int
	MemoryPerCard int64
	// GPUs holds indexes 0..max(WholeGPUs, Cards)-1, in order.
	GPUs []GPU
	// Unhealthy and Degraded count GPUs by health (drained ones are Unhealthy).
	Unhealthy, Degraded int
	// Heartbeat is when the node's agent last confirmed its report (its heartbeat Lease, or for an
	// agent of an earlier release gpuhealthv1.HeartbeatKey;
	// zero: no heartbeat, an agent without them). HeartbeatUnreadable: the key holds no time,
	// which readers take for a stale report.
	Heartbeat           time.Time
	HeartbeatUnreadable bool
}

// Stale reports whether the node's report is older than staleAfter at now (0: never), and says
// since when.
func (n *NodeGPUs) Stale(now time.Time, staleAfter time.Duration) (bool, string) {
	switch {
	case staleAfter <= 0:
		return false, ""
	case n.HeartbeatUnreadable:
		return true, "the gpuhealth report of this node is stale: its heartbeat is unreadable, or its agent's heartbeat Lease is gone or not renewed by it"
	case n.Heartbeat.IsZero():
		return false, ""
	}
	stale, future := gpuhealthv1.HeartbeatStale(n.Heartbeat, now, staleAfter)
	switch {
	case !stale:
		return false, ""
	case future:
		return true, "the gpuhealth report of this node is stale: its heartbeat " + n.Heartbeat.UTC().Format(time.RFC3339) +
			" is in the future (a node clock far ahead, or a value written by hand); GPU pods are not placed on it"
	}
	return true, "the gpuhealth report of this node is stale since " + n.Heartbeat.UTC().Format(time.RFC3339) +
		" (its agent stopped confirming it); GPU pods are not placed on it"
}

// ParseNode reads a node's GPU capacity and health annotations. It never fails: unusable entries
// are skipped and described in the warnings, and the rest still count.
//
// A GPU is Unhealthy when volcano.sh/gpu-unhealthy-ids lists its index, when gpu-health says
// Unhealthy, when gpu-drains drains it, or when HAMi's hami.io/device-cordon lists its UUID (a
// HAMi node: cordoned by an operator or by gpuhealth's hami reporter); Degraded when gpu-health says Degraded (or a MIG
// instance on it is not Healthy) and it is not Unhealthy.
func ParseNode(node *corev1.Node) (NodeGPUs, []string) {
	var w warnings
	n := NodeGPUs{Name: node.Name}
	n.WholeGPUs = quantity(node.Status.Capacity, ResourceGPU, &w)
	n.Cards = quantity(node.Status.Capacity, ResourceGPUNumber, &w)
	if n.Cards > 0 {
		if mem, ok := node.Status.Capacity[ResourceGPUMemory]; ok {
			n.MemoryPerCard = mem.Value() / int64(n.Cards)
		}
		if n.MemoryPerCard <= 0 {
			w.add("", "volcano.sh/gpu-number is %d but volcano.sh/gpu-memory is missing or zero: no GPU sharing", n.Cards)
			n.Cards, n.MemoryPerCard = 0, 0
		}
	}
	count := max(n.WholeGPUs, n.Cards)
	n.GPUs = make([]GPU, count)
	for i := range n.GPUs {
		n.GPUs[i].Index = i
	}

	ann := node.Annotations
	if v, ok := ann[gpuhealthv1.UnhealthyIDsKey]; ok {
		for _, i := range parseIndexList(v, count, &w) {
			n.GPUs[i].Health = health.Unhealthy
		}
	}
	uuids := map[string]int{} // UUID -> index, from gpu-health
	if v, ok := ann[gpuhealthv1.HealthKey]; ok {
		parseHealth(v, n.GPUs, uuids, &w)
	}
	if v, ok := ann[gpuhealthv1.DrainsKey]; ok {
		parseDrains(v, n.GPUs, uuids, &w)
	}
	if v, ok := ann[gpuhealthv1.HAMiCordonKey]; ok {
		parseCordon(v, n.GPUs, uuids, &w)
	}
	if v, ok := ann[gpuhealthv1.HeartbeatKey]; ok {
		t, err := gpuhealthv1.ParseHeartbeat(v)
		if err != nil {
			w.add(gpuhealthv1.HeartbeatKey, "%v: the report counts as stale", err)
			n.HeartbeatUnreadable = true
		}
		n.Heartbeat = t
	}
	for _, g := range n.GPUs {
		switch g.Health {
		case health.Unhealthy:
			n.Unhealthy++
		case health.Degraded:
			n.Degraded++
		}
	}
	return n, w.list
}

// UUIDOf returns the UUID the gpu-health annotation gives the card at index, if any.
func (n *NodeGPUs) UUIDOf(index int) string {
	if index < 0 || index >= len(n.GPUs) {
		return ""
	}
	return n.GPUs[index].UUID
}

// warnings collects at most maxWarnings messages per key and counts the rest.
type warnings struct {
	list    []string
	perKey  map[string]int
	dropped map[string]int
}

func (w *warnings) add(key, format string, args ...any) {
	if w.perKey == nil {
		w.perKey, w.dropped = map[string]int{}, map[string]int{}
	}
	if w.perKey[key] >= maxWarnings {
		if w.dropped[key] == 0 {
			w.list = append(w.list, fmt.Sprintf("%s: more entries ignored (at most %d warnings are given per annotation)", key, maxWarnings))
		}
		w.dropped[key]++
		return
	}
	w.perKey[key]++
	msg := fmt.Sprintf(format, args...)
	if key != "" {
		msg = key + ": " + msg
	}
	w.list = append(w.list, msg)
}

// warnFor returns the wire readers' warn function for key's value.
func (w *warnings) warnFor(key string) gpuhealthv1.Warn {
	return func(format string, args ...any) { w.add(key, format, args...) }
}

// quantity reads a count from capacity, clamped to [0, MaxGPUsPerNode].
func quantity(capacity corev1.ResourceList, name corev1.ResourceName, w *warnings) int {
	q, ok := capacity[name]
	if !ok {
		return 0
	}
	v := q.Value()
	switch {
	case v < 0:
		w.add("", "capacity %s is negative (%s): taken as 0", name, q.String())
		return 0
	case v > MaxGPUsPerNode:
		w.add("", "capacity %s is %s, more than %d: taken as %d", name, q.String(), MaxGPUsPerNode, MaxGPUsPerNode)
		return MaxGPUsPerNode
	}
	return int(v)
}

// parseIndexList reads volcano.sh/gpu-unhealthy-ids as Volcano's scheduler does.
func parseIndexList(v string, count int, w *warnings) []int {
	return gpuhealthv1.ReadUnhealthyIDs(v, count, w.warnFor(gpuhealthv1.UnhealthyIDsKey))
}

// parseHealth applies the gpu-health annotation to gpus and records UUID -> index.
func parseHealth(v string, gpus []GPU, uuids map[string]int, w *warnings) {
	key := gpuhealthv1.HealthKey
	var migs []gpuhealthv1.HealthEntry
	for _, e := range gpuhealthv1.ReadHealth(v, w.warnFor(key)) {
		if e.ParentUUID != "" {
			migs = append(migs, e)
			continue
		}
		if e.Missing {
			continue // a GPU the node lacks: the capacity the scheduler sees already lacks it
		}
		if e.Index < 0 || e.Index >= len(gpus) {
			w.add(key, "entry %s: index %d is out of range (the node has %d GPUs): ignored", gpuhealthv1.Short(e.UUID), e.Index, len(gpus))
			continue
		}
		if prev := gpus[e.Index].UUID; prev != "" {
			w.add(key, "entries %s and %s both claim index %d: the worse health wins", gpuhealthv1.Short(prev), gpuhealthv1.Short(e.UUID), e.Index)
		} else {
			gpus[e.Index].UUID = e.UUID
		}
		uuids[e.UUID] = e.Index
		worsen(&gpus[e.Index], e.Health)
	}
	// A MIG instance that is not Healthy makes its card Degraded: the card still serves the
	// other instances, but a whole-card or shared pod should prefer a clean one.
	for _, m := range migs {
		i, ok := uuids[m.ParentUUID]
		if !ok {
			w.add(key, "MIG instance %s: parent %s is not listed: ignored", gpuhealthv1.Short(m.UUID), gpuhealthv1.Short(m.ParentUUID))
			continue
		}
		if m.Health != health.Healthy {
			worsen(&gpus[i], health.Degraded)
		}
	}
}

// parseDrains applies the gpu-drains annotation. A drain names its GPU by UUID; the index it
// recorded is used only when gpu-health does not list that UUID (indexes can shift, UUIDs not).
func parseDrains(v string, gpus []GPU, uuids map[string]int, w *warnings) {
	key := gpuhealthv1.DrainsKey
	for _, d := range gpuhealthv1.ReadDrains(v, w.warnFor(key)) {
		i, known := uuids[d.UUID]
		if !known {
			i = d.Index
		} else if d.Index != i {
			w.add(key, "entry %s: recorded index %d, but the GPU is now index %d: using %d", gpuhealthv1.Short(d.UUID), d.Index, i, i)
		}
		if i < 0 || i >= len(gpus) {
			w.add(key, "entry %s: index %d is out of range (the node has %d GPUs): ignored", gpuhealthv1.Short(d.UUID), i, len(gpus))
			continue
		}
		gpus[i].Drained = true
		worsen(&gpus[i], health.Unhealthy)
		if gpus[i].UUID == "" {
			gpus[i].UUID = d.UUID
		}
	}
}

// parseCordon applies HAMi's cordon the way HAMi's scheduler reads it (gpuhealthv1.ReadCordon:
// device IDs, which are GPU UUIDs). A UUID gpu-health does not list cannot be placed and is
// reported.
func parseCordon(v string, gpus []GPU, uuids map[string]int, w *warnings) {
	key := gpuhealthv1.HAMiCordonKey
	for _, uuid := range gpuhealthv1.ReadCordon(v) {
		i, ok := uuids[uuid]
		if !ok {
			w.add(key, "GPU %s is not listed in %s: ignored", gpuhealthv1.Short(uuid), gpuhealthv1.HealthKey)
			continue
		}
		worsen(&gpus[i], health.Unhealthy)
	}
}

func worsen(g *GPU, h health.Severity) {
	if h > g.Health {
		g.Health = h
	}
}
