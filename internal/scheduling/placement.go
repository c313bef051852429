package scheduling

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// MaxScore is the best score Score gives, kube-scheduler's MaxExtenderPriority.
const MaxScore int64 = 10

// NoCard is the card of a pod or placement that holds no shared card.
const NoCard = -1

// Request is what a pod asks of one node's GPUs.
type Request struct {
	// GPUs is the number of whole nvidia.com/gpu devices.
	GPUs int64
	// MemoryMiB is the volcano.sh/gpu-memory the pod needs on one shared card.
	MemoryMiB int64
}

// IsZero reports whether the pod asks for no GPU at all.
func (r Request) IsZero() bool { return r.GPUs <= 0 && r.MemoryMiB <= 0 }

// PodRequest returns the GPUs and GPU memory a pod needs, the way kube-scheduler computes a
// pod's effective request: the sum over its containers (and restartable init containers, which
// run beside them), or the largest init container's request if that is more. A container's
// request is its limit when only the limit is set, as the API server defaults it.
func PodRequest(pod *corev1.Pod) Request {
	var sum, initMax Request
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		r := containerRequest(c)
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sum.GPUs += r.GPUs
			sum.MemoryMiB += r.MemoryMiB
			continue
		}
		initMax.GPUs = max(initMax.GPUs, r.GPUs)
		initMax.MemoryMiB = max(initMax.MemoryMiB, r.MemoryMiB)
	}
	for i := range pod.Spec.Containers {
		r := containerRequest(&pod.Spec.Containers[i])
		sum.GPUs += r.GPUs
		sum.MemoryMiB += r.MemoryMiB
	}
	return Request{GPUs: max(sum.GPUs, initMax.GPUs), MemoryMiB: max(sum.MemoryMiB, initMax.MemoryMiB)}
}

func containerRequest(c *corev1.Container) Request {
	get := func(name corev1.ResourceName) int64 {
		if q, ok := c.Resources.Requests[name]; ok {
			return max(q.Value(), 0)
		}
		if q, ok := c.Resources.Limits[name]; ok {
			return max(q.Value(), 0)
		}
		return 0
	}
	return Request{GPUs: get(ResourceGPU), MemoryMiB: get(ResourceGPUMemory)}
}

// Hold is what one scheduled pod holds on its node.
type Hold struct {
	Node string
	// GPUs are whole GPUs; Card and MemoryMiB a share of one card (Card is NoCard when none).
	GPUs      int64
	Card      int
	MemoryMiB int64
}

// PodHold returns what a pod holds on its node. ok is false for a pod that holds nothing: not
// scheduled, finished (Succeeded or Failed), or asking for no GPU. A pod being deleted still
// holds its GPUs until it finishes. A GPU-sharing pod without a valid volcano.sh/gpu-index holds
// no card and gets a warning: its memory cannot be charged to any card.
func PodHold(pod *corev1.Pod) (h Hold, ok bool, warning string) {
	if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return Hold{}, false, ""
	}
	req := PodRequest(pod)
	if req.IsZero() {
		return Hold{}, false, ""
	}
	h = Hold{Node: pod.Spec.NodeName, GPUs: req.GPUs, Card: NoCard}
	if req.MemoryMiB > 0 {
		cards, set, ok := gpuhealthv1.ReadPodCards(pod.Annotations)
		switch {
		case !set:
			warning = fmt.Sprintf("GPU-sharing pod has no %s annotation: its %d MiB are not charged to a card", GPUIndexAnnotation, req.MemoryMiB)
		case !ok || len(cards) != 1:
			warning = fmt.Sprintf("%s %s is not a card index: its %d MiB are not charged to a card", GPUIndexAnnotation, gpuhealthv1.Short(pod.Annotations[GPUIndexAnnotation]), req.MemoryMiB)
		default:
			h.Card, h.MemoryMiB = cards[0], req.MemoryMiB
		}
	}
	return h, true, warning
}

// Usage is what the pods already on one node hold.
type Usage struct {
	GPUs int64
	// CardMemory is the MiB held on each shared card, by index.
	CardMemory map[int]int64
}

// Add charges a hold to u.
func (u *Usage) Add(h Hold) {
	u.GPUs += h.GPUs
	if h.Card != NoCard && h.MemoryMiB > 0 {
		if u.CardMemory == nil {
			u.CardMemory = map[int]int64{}
		}
		u.CardMemory[h.Card] += h.MemoryMiB
	}
}

// Remove undoes Add.
func (u *Usage) Remove(h Hold) {
	u.GPUs -= h.GPUs
	if h.Card != NoCard && h.MemoryMiB > 0 && u.CardMemory != nil {
		u.CardMemory[h.Card] -= h.MemoryMiB
		if u.CardMemory[h.Card] <= 0 {
			delete(u.CardMemory, h.Card)
		}
	}
}

// Placement is the verdict on one node for one request.
type Placement struct {
	Fits bool
	// Reason says why the pod does not fit; empty when it fits.
	Reason string
	// Card is the shared card chosen for a GPU-sharing request, NoCard otherwise.
	Card int
	// Score is 0..MaxScore; 0 when the pod does not fit.
	Score int64
}

// Filter reports whether req fits node given what the pods on it already hold, and if not why.
//
// Whole GPUs: the healthy, undrained GPUs not held by a pod must cover the request, counted
// conservatively as capacity − unhealthy or drained − held (a pod may hold a GPU that has since
// failed; the device plugin's own accounting then has the final word). GPU sharing: some healthy
// or Degraded, undrained card must have the memory free.
func Filter(req Request, node *NodeGPUs, used Usage) (fits bool, reason string) {
	p := place(req, node, used, nil)
	return p.Fits, p.Reason
}

// Reasons remembers the reasons Filter gives, so that a request judged against thousands of
// nodes builds each distinct reason once: on a large cluster most nodes fail for one of a few
// reasons ("4 requested, 0 free (0 unhealthy or drained, 8 in use)"), and building them was a
// large part of a /filter call. The zero value is ready to use; it is not safe for concurrent
// use. It keeps at most maxReasons reasons (and starts over when full), so it may serve one
// request after another.
type Reasons struct {
	m map[reasonKey]string
}

// maxReasons bounds a Reasons: a busy cluster has a few dozen distinct reasons.
const maxReasons = 1024

// reasonKey is what a reason says: its kind and its numbers.
type reasonKey struct {
	kind       uint8
	a, b, c, d int64
}

const (
	reasonWholeShort uint8 = iota
	reasonSharedFull
)

// get returns the reason of key, built by build the first time. A nil Reasons builds each time.
func (r *Reasons) get(key reasonKey, build func(reasonKey) string) string {
	if r == nil {
		return build(key)
	}
	if s, ok := r.m[key]; ok {
		return s
	}
	if r.m == nil {
		r.m = map[reasonKey]string{}
	}
	if len(r.m) >= maxReasons {
		clear(r.m)
	}
	s := build(key)
	r.m[key] = s
	return s
}

// ScoreWith is Score with the reasons of the nodes that do not fit taken from r.
func ScoreWith(r *Reasons, req Request, node *NodeGPUs, used Usage) int64 {
	return place(req, node, used, r).Score
}

// FilterWith is Filter with the reasons taken from r.
func FilterWith(r *Reasons, req Request, node *NodeGPUs, used Usage) (fits bool, reason string) {
	p := place(req, node, used, r)
	return p.Fits, p.Reason
}

// Score rates a node for req from 0 to MaxScore: higher where the pod packs onto cards (or
// nodes) already in use, so that whole free cards stay free; lower where the node has Degraded
// cards; 0 where the pod would, or for whole GPUs must, run on a Degraded card, or does not fit.
func Score(req Request, node *NodeGPUs, used Usage) int64 {
	return Place(req, node, used).Score
}

// ChooseCard returns the card a GPU-sharing request should get on node, or NoCard.
func ChooseCard(req Request, node *NodeGPUs, used Usage) int {
	return Place(req, node, used).Card
}

// Place is Filter, Score and ChooseCard in one pass.
func Place(req Request, node *NodeGPUs, used Usage) Placement {
	return place(req, node, used, nil)
}

func place(req Request, node *NodeGPUs, used Usage, reasons *Reasons) Placement {
	p := Placement{Fits: true, Card: NoCard, Score: MaxScore}
	if req.IsZero() {
		p.Score = 0
		return p
	}
	if req.GPUs > 0 {
		score, reason := placeWhole(req.GPUs, node, used, reasons)
		if reason != "" {
			return Placement{Reason: reason, Card: NoCard}
		}
		p.Score = min(p.Score, score)
	}
	if req.MemoryMiB > 0 {
		card, score, reason := placeShared(req.MemoryMiB, node, used, reasons)
		if reason != "" {
			return Placement{Reason: reason, Card: NoCard}
		}
		p.Card, p.Score = card, min(p.Score, score)
	}
	return p
}

// packScore maps the fill after placement (held/capacity, capped at 1) to 2..MaxScore, leaving
// 0 and 1 for Degraded penalties.
func packScore(held, capacity int64) int64 {
	if capacity <= 0 {
		return 2
	}
	return 2 + (MaxScore-2)*min(held, capacity)/capacity
}

func placeWhole(want int64, node *NodeGPUs, used Usage, reasons *Reasons) (int64, string) {
	if node.WholeGPUs == 0 {
		return 0, "node has no " + string(ResourceGPU)
	}
	var unhealthy, degraded int64
	for _, g := range node.GPUs[:node.WholeGPUs] {
		switch g.Health {
		case health.Unhealthy:
			unhealthy++
		case health.Degraded:
			degraded++
		}
	}
	usable := int64(node.WholeGPUs) - unhealthy
	free := usable - max(used.GPUs, 0)
	if free < want {
		// On a large cluster most nodes fail here, thousands per filter call.
		return 0, reasons.get(reasonKey{reasonWholeShort, want, max(free, 0), unhealthy, max(used.GPUs, 0)}, wholeShort)
	}
	score := packScore(used.GPUs+want, usable)
	if degraded > 0 {
		// The device plugin picks the devices; count held ones as clean, the worst case.
		if free-degraded < want {
			return 0, ""
		}
		score /= 2
	}
	return score, ""
}

func placeShared(want int64, node *NodeGPUs, used Usage, reasons *Reasons) (card int, score int64, reason string) {
	if node.Cards == 0 {
		return NoCard, 0, "node does not share GPUs (no " + string(ResourceGPUNumber) + ")"
	}
	if want > node.MemoryPerCard {
		return NoCard, 0, fmt.Sprintf("GPU memory request %d MiB is more than a card's %d MiB", want, node.MemoryPerCard)
	}
	card = NoCard
	var best GPU
	var bestHeld int64
	unhealthy, degraded := 0, 0
	for _, g := range node.GPUs[:node.Cards] {
		switch g.Health {
		case health.Unhealthy:
			unhealthy++
			continue
		case health.Degraded:
			degraded++
		}
		held := used.CardMemory[g.Index]
		if node.MemoryPerCard-held < want {
			continue
		}
		// Healthy before Degraded, then the fullest card (packing), then the lowest index.
		if card == NoCard || g.Health < best.Health || (g.Health == best.Health && held > bestHeld) {
			card, best, bestHeld = g.Index, g, held
		}
	}
	if card == NoCard {
		return NoCard, 0, reasons.get(reasonKey{reasonSharedFull, want, int64(unhealthy), int64(node.Cards), 0}, sharedFull)
	}
	switch {
	case best.Health == health.Degraded:
		score = 0
	case degraded > 0:
		score = packScore(bestHeld+want, node.MemoryPerCard) - 1
	default:
		score = packScore(bestHeld+want, node.MemoryPerCard)
	}
	return card, score, ""
}

// wholeShort is the reason of a node without enough free whole GPUs; k holds want, free,
// unhealthy and used.
func wholeShort(k reasonKey) string {
	return "not enough healthy GPUs: " + strconv.FormatInt(k.a, 10) + " requested, " +
		strconv.FormatInt(k.b, 10) + " free (" + strconv.FormatInt(k.c, 10) +
		" unhealthy or drained, " + strconv.FormatInt(k.d, 10) + " in use)"
}

// sharedFull is the reason of a node where no card has the memory free; k holds want, the
// unhealthy cards and all cards.
func sharedFull(k reasonKey) string {
	return fmt.Sprintf("no healthy GPU has %d MiB free (%d of %d cards unhealthy or drained)", k.a, k.b, k.c)
}
