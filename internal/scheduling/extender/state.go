package extender

import (
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
)

// nodeEntry is a parsed node; entries are replaced, never changed, so a reader may keep one.
type nodeEntry struct {
	gpus            scheduling.NodeGPUs
	resourceVersion string
	warnings        []string
}

// state is what the extender knows about the cluster: each node's GPUs, parsed once per change,
// and what the pods on each node hold, kept up to date by informer events so that a request
// costs no API call and no scan of all pods.
type state struct {
	mu    sync.RWMutex
	nodes map[string]*nodeSlot
	holds map[types.UID]holdEntry
	// staleAfter and clock tell whether a node's new report ends its staleness (see
	// scheduling.Improved); 0: reports never go stale.
	staleAfter time.Duration
	clock      clock.PassiveClock
}

// nodeSlot is all the state knows about one node name, so that a request looks each node up once.
// It exists while the node is in the cache or pods on it hold something.
type nodeSlot struct {
	entry *nodeEntry // nil before the node informer has seen the node, and after it is deleted
	usage scheduling.Usage
	// hasLease: the node's agent has a heartbeat Lease, renewed at leaseBeat (zero: never, or
	// by another holder), which is the node's heartbeat instead of its annotation's.
	hasLease  bool
	leaseBeat time.Time
}

func newState() *state {
	return &state{
		nodes: map[string]*nodeSlot{},
		holds: map[types.UID]holdEntry{},
	}
}

// slotLocked returns the slot of name, creating it.
func (s *state) slotLocked(name string) *nodeSlot {
	sl := s.nodes[name]
	if sl == nil {
		sl = &nodeSlot{}
		s.nodes[name] = sl
	}
	return sl
}

// tidyLocked drops the slot of name once it holds nothing.
func (s *state) tidyLocked(name string, sl *nodeSlot) {
	if sl.entry == nil && !sl.hasLease && sl.usage.GPUs == 0 && len(sl.usage.CardMemory) == 0 {
		delete(s.nodes, name)
	}
}

// setNode parses node and stores it. It returns the warnings when they differ from the node's
// previous ones, so that each problem is logged once, not at every status heartbeat, and whether
// the node can now hold work it could not before (scheduling.Improved).
func (s *state) setNode(node *corev1.Node) (newWarnings []string, better bool) {
	gpus, warnings := scheduling.ParseNode(node)
	e := &nodeEntry{gpus: gpus, resourceVersion: node.ResourceVersion, warnings: warnings}
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.slotLocked(node.Name)
	sl.applyLease(e)
	gpus = e.gpus
	prev := sl.entry
	sl.entry = e
	if prev == nil {
		return warnings, true
	}
	var now time.Time
	if s.staleAfter > 0 {
		now = s.clock.Now()
	}
	better = scheduling.Improved(&prev.gpus, &gpus, now, s.staleAfter)
	if !slices.Equal(prev.warnings, warnings) {
		return warnings, better
	}
	return nil, better
}

// applyLease makes the slot's heartbeat Lease, when the node has one, e's heartbeat.
func (sl *nodeSlot) applyLease(e *nodeEntry) {
	if sl.hasLease {
		e.gpus.Heartbeat, e.gpus.HeartbeatUnreadable = sl.leaseBeat, sl.leaseBeat.IsZero()
	}
}

// setLease records the renewal of the heartbeat Lease of node (zero: never renewed by its agent,
// or deleted: a node whose agent had a Lease and lost it is stale, not an agent of an earlier
// release) and reports whether the node can now hold work it could not before.
func (s *state) setLease(node string, renewed time.Time) (better bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.slotLocked(node)
	sl.hasLease, sl.leaseBeat = true, renewed
	if sl.entry == nil {
		return false
	}
	prev := sl.entry
	next := *prev
	sl.applyLease(&next)
	sl.entry = &next
	var now time.Time
	if s.staleAfter > 0 {
		now = s.clock.Now()
	}
	return scheduling.Improved(&prev.gpus, &next.gpus, now, s.staleAfter)
}

func (s *state) deleteNode(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.nodes[name]; sl != nil {
		sl.entry = nil
		s.tidyLocked(name, sl)
	}
}

// holdEntry is what one pod holds; assumed entries come from our own /bind, before the pod
// informer has seen the pod bound.
type holdEntry struct {
	hold    scheduling.Hold
	assumed bool
}

// observe records what the pod informer says the pod with uid holds. A pod the informer shows
// holding nothing keeps a hold /bind assumed for it: an event from before the binding (our own
// annotation patch) must not undo the charge.
func (s *state) observe(uid types.UID, h scheduling.Hold, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, had := s.holds[uid]; had && e.assumed && !ok {
		return
	}
	s.setLocked(uid, holdEntry{hold: h}, ok)
}

// forget removes what the pod with uid holds (the pod is gone).
func (s *state) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(uid, holdEntry{}, false)
}

// assume charges h to the pod with uid until the pod informer sees the pod bound.
func (s *state) assume(uid types.UID, h scheduling.Hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(uid, holdEntry{hold: h, assumed: true}, true)
}

func (s *state) setLocked(uid types.UID, e holdEntry, ok bool) {
	if old, had := s.holds[uid]; had {
		if sl := s.nodes[old.hold.Node]; sl != nil {
			sl.usage.Remove(old.hold)
			s.tidyLocked(old.hold.Node, sl)
		}
		delete(s.holds, uid)
	}
	if !ok {
		return
	}
	s.holds[uid] = e
	s.slotLocked(e.hold.Node).usage.Add(e.hold)
}

// view is the state as one request sees it, at one point in time: state.read hands it out with
// the state read-locked, and it must not be used after read returns. Parsed nodes it returns may
// be kept (entries are replaced, never changed); usages are copies.
type view struct{ s *state }

// read calls f with a view of the state, holding the read lock for all of f, so that a request
// about thousands of nodes takes the lock once. f must not call other methods of the state.
func (s *state) read(f func(view)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	f(view{s})
}

// usage returns what the pods on node hold.
func (v view) usage(node string) scheduling.Usage {
	if sl := v.s.nodes[node]; sl != nil {
		return sl.usage
	}
	return scheduling.Usage{}
}

// cached returns the parsed node called name from the cache (nil when it has none) and what the
// pods on it hold.
func (v view) cached(name string) (*scheduling.NodeGPUs, scheduling.Usage) {
	return v.s.nodes[name].cached()
}

// cachedBytes is cached for a name read from a request body; the lookups do not copy name.
func (v view) cachedBytes(name []byte) (*scheduling.NodeGPUs, scheduling.Usage) {
	return v.s.nodes[string(name)].cached()
}

func (sl *nodeSlot) cached() (*scheduling.NodeGPUs, scheduling.Usage) {
	switch {
	case sl == nil:
		return nil, scheduling.Usage{}
	case sl.entry == nil:
		return nil, sl.usage
	}
	return &sl.entry.gpus, sl.usage
}

// node returns the parsed node from the cache; when the request carries the node object too,
// the cached parse is used only if it is of the same resourceVersion.
func (v view) node(name string, fromRequest *corev1.Node) (*scheduling.NodeGPUs, []string) {
	var e *nodeEntry
	if sl := v.s.nodes[name]; sl != nil {
		e = sl.entry
	}
	if fromRequest == nil {
		if e == nil {
			return nil, nil
		}
		return &e.gpus, nil
	}
	if e != nil && e.resourceVersion == fromRequest.ResourceVersion && fromRequest.ResourceVersion != "" {
		return &e.gpus, nil
	}
	gpus, warnings := scheduling.ParseNode(fromRequest)
	return &gpus, warnings
}

// place chooses the card of a GPU-sharing request on the named node of the cache, and returns it
// with its UUID ("" when the agent reported none).
func (s *state) place(req scheduling.Request, name string) (card int, uuid string, err error) {
	card = scheduling.NoCard
	s.read(func(v view) {
		node, _ := v.node(name, nil)
		if node == nil {
			err = fmt.Errorf("node %s is not in the extender's cache", name)
			return
		}
		p := scheduling.Place(req, node, v.usage(name))
		if !p.Fits {
			err = fmt.Errorf("node %s: %s", name, p.Reason)
			return
		}
		card, uuid = p.Card, node.UUIDOf(p.Card)
	})
	return card, uuid, err
}
