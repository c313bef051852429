package scheduling

import (
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Judge gives the verdict on each node a scheduling request names, the whole of what a filter
// decides about one node: whether its report is stale, whether the pod fits, why not, and
// whether GPU health is what keeps the pod off. The verdicts of one request share a Judge (the
// reasons already built, scratch space, the request's time). A Judge may serve one request after
// another (its Reasons stay bounded); it is not safe for concurrent use. The zero value judges
// no report stale and explains nothing.
type Judge struct {
	// Now is when the request came: every node's staleness is judged against it.
	Now time.Time
	// StaleAfter is how old a node's report may be before the node takes no GPU work
	// (NodeGPUs.Stale); 0: reports never go stale.
	StaleAfter time.Duration
	// Explain asks every verdict that does not fit whether GPU health is to blame
	// (Verdict.HealthBlocks). It costs a second placement on those nodes, so a caller that
	// does not act on the answer leaves it off.
	Explain bool

	reasons Reasons
	scratch []GPU
}

// Verdict is the judgement on one node.
type Verdict struct {
	Fits bool
	// Reason says why the pod does not fit; empty when it fits.
	Reason string
	// HealthBlocks (with Judge.Explain) says that GPU health keeps the pod off the node: the
	// node's report is stale, or the pod would fit were none of its GPUs Unhealthy or drained.
	// Such a pod is worth retrying when the node gets better (Improved).
	HealthBlocks bool
}

// Node judges req on node, given what the pods on it already hold. A pod that asks for no GPU
// fits any node, stale or not.
func (j *Judge) Node(req Request, node *NodeGPUs, used Usage) Verdict {
	if !req.IsZero() {
		if stale, why := node.Stale(j.Now, j.StaleAfter); stale {
			return Verdict{Reason: why, HealthBlocks: j.Explain} // a heartbeat makes the node better
		}
	}
	fits, reason := FilterWith(&j.reasons, req, node, used)
	if fits {
		return Verdict{Fits: true}
	}
	return Verdict{Reason: reason, HealthBlocks: j.Explain && j.healthBlocks(req, node, used)}
}

// Score is Score with the reasons of the nodes that do not fit taken from the Judge's.
func (j *Judge) Score(req Request, node *NodeGPUs, used Usage) int64 {
	return ScoreWith(&j.reasons, req, node, used)
}

// healthBlocks reports whether req, which does not fit node, would fit if none of the node's
// GPUs were Unhealthy or drained.
func (j *Judge) healthBlocks(req Request, node *NodeGPUs, used Usage) bool {
	if node.Unhealthy == 0 {
		return false
	}
	if req.GPUs > 0 && int64(node.WholeGPUs)-max(used.GPUs, 0) < req.GPUs {
		// Pods (or the node's size) are in the way whatever the health. The common case on a
		// large cluster, answered without building Filter's reason.
		return false
	}
	healed := *node
	healed.GPUs = append(j.scratch[:0], node.GPUs...)
	j.scratch = healed.GPUs
	for i := range healed.GPUs {
		if healed.GPUs[i].Health == health.Unhealthy {
			healed.GPUs[i].Health, healed.GPUs[i].Drained = health.Healthy, false
		}
	}
	healed.Unhealthy = 0
	fits, _ := Filter(req, &healed, used)
	return fits
}

// Improved reports whether a node parsed as next can hold work that prev could not: it is new
// (prev is nil), its GPU capacity grew, a GPU that was Unhealthy or drained is not any more, or
// its report, stale before, is not at now (staleAfter as in Judge).
func Improved(prev, next *NodeGPUs, now time.Time, staleAfter time.Duration) bool {
	if prev == nil {
		return true
	}
	if next.WholeGPUs > prev.WholeGPUs || next.Cards > prev.Cards || next.MemoryPerCard > prev.MemoryPerCard {
		return true
	}
	for i := range min(len(prev.GPUs), len(next.GPUs)) {
		if prev.GPUs[i].Health == health.Unhealthy && next.GPUs[i].Health != health.Unhealthy {
			return true
		}
	}
	if staleAfter <= 0 {
		return false
	}
	was, _ := prev.Stale(now, staleAfter)
	is, _ := next.Stale(now, staleAfter)
	return was && !is
}
