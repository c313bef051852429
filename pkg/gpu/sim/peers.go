package sim

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// EventPeerFault is a fault another node of this node's NVLink domain reports on one of its
// GPUs (or, with cleared, no longer reports): what the agent reads from its peers' gpu-health
// annotations. Only `gpuhealth simulate` replays it; an agent reads its peers from the API
// server, so its sim backend refuses it.
const EventPeerFault EventKind = "peerFault"

// PeerSink is what a gpu.Sink can also do, discovered by type assertion: take the peer nodes'
// faults (health.Tracker.SetPeerFaults), the whole set each time it changes. Run refuses a
// scenario with peerFault events when its sink cannot.
type PeerSink interface {
	SetPeerFaults(faults []health.PeerFault, at time.Time)
}

// peerFaultSpec is a peerFault event's value.
type peerFaultSpec struct {
	Node    *string `yaml:"node"`
	GPU     *int    `yaml:"gpu"`
	UUID    *string `yaml:"uuid"`
	XID     *uint32 `yaml:"xid"`
	Cleared *bool   `yaml:"cleared"`
}

// peerFaultEvent checks a peerFault event and fills ev: the peer's GPU is named by its index,
// its UUID defaulting to the simulator's for that node and index.
func (sc *Scenario) peerFaultEvent(spec eventSpec, ev Event) (Event, error) {
	p := spec.PeerFault
	switch {
	case spec.AfterReset != nil:
		return ev, errors.New("afterReset: a peer's fault follows no reset of this node's GPUs; give at")
	case spec.XIDSeverity != nil || spec.CausedByPrevious != nil || spec.GPUInstance != nil || spec.ComputeInstance != nil:
		return ev, errors.New("xidSeverity/causedByPrevious/gpuInstance/computeInstance: only qualify this node's xid events")
	case spec.GPU != nil:
		return ev, errors.New("gpu: a peer's fault names the peer's GPU in peerFault.gpu; remove gpu")
	case spec.Repeat != nil:
		return ev, errors.New("repeat: a peer's fault is reported once")
	case p.Node == nil || *p.Node == "":
		return ev, errors.New("peerFault.node: required (the peer's node name)")
	case *p.Node == sc.Node:
		return ev, fmt.Errorf("peerFault.node: %q is this scenario's own node; a peer is another node of its NVLink domain", *p.Node)
	case p.GPU == nil || *p.GPU < 0 || *p.GPU >= MaxGPUs:
		return ev, fmt.Errorf("peerFault.gpu: required, the peer's GPU index from 0 to %d", MaxGPUs-1)
	case p.XID == nil || *p.XID == 0:
		return ev, errors.New("peerFault.xid: required, the XID of the peer GPU's fault (not 0)")
	case p.UUID != nil && *p.UUID == "":
		return ev, errors.New("peerFault.uuid: must not be empty when given")
	}
	uuid := GPUUUID(*p.Node, *p.GPU)
	if p.UUID != nil {
		uuid = *p.UUID
	}
	ev.Peer = health.PeerFault{Node: *p.Node, UUID: uuid, Index: *p.GPU, XID: *p.XID}
	ev.PeerCleared = p.Cleared != nil && *p.Cleared
	return ev, nil
}

// HasPeerFaults reports whether the scenario has peerFault events.
func (sc *Scenario) HasPeerFaults() bool {
	return slices.ContainsFunc(sc.Events, func(e Event) bool { return e.Kind == EventPeerFault })
}

// peerKey names one peer fault.
type peerKey struct {
	node, uuid string
	xid        uint32
}

// applyPeerFault adds the event's fault to the peers' set (its time is when it began) or
// removes it, and hands the whole set to the sink.
func (b *Backend) applyPeerFault(ev Event, now time.Time, sink PeerSink) {
	k := peerKey{ev.Peer.Node, ev.Peer.UUID, ev.Peer.XID}
	if ev.PeerCleared {
		delete(b.peers, k)
	} else if _, ok := b.peers[k]; !ok {
		f := ev.Peer
		f.Since = now
		b.peers[k] = f
	}
	all := slices.SortedFunc(maps.Values(b.peers), func(a, b health.PeerFault) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Index, b.Index), cmp.Compare(a.XID, b.XID))
	})
	sink.SetPeerFaults(all, now)
}
