package health_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// causedBy149 is an XID 145 the driver says XID 149 caused: what the GPUs of an NVL72 rack log
// when one GPU's NVLink fails (marin#9086; open-gpu-kernel-modules#1150 for XID 45).
func causedBy149(s *health.Signal) {
	s.XID, s.XIDFlags, s.CauseXID = 145, health.XIDCausedByPrevious|health.XIDFatal, 149
}

// peerUUID is the peer's GPU 2, as NVML names it.
const peerUUID = "GPU-9277d399-0674-44a9-b64e-d85bb19ce2b0"

func peer149(since time.Duration) health.PeerFault {
	return health.PeerFault{Node: "nvl72-rack7-node3", UUID: peerUUID, Index: 2, XID: 149, Since: at(since)}
}

func (h *harness) setPeers(d time.Duration, faults ...health.PeerFault) []health.Transition {
	h.t.Helper()
	out, err := h.tr.SetPeerFaults(faults, at(d), nil)
	if err != nil {
		h.t.Fatalf("SetPeerFaults: %v", err)
	}
	return out
}

func TestXIDCausedByAPeersFaultIsAttributedToIt(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	if out := h.setPeers(0, peer149(0)); len(out) != 0 {
		t.Fatalf("a peer's fault changed this node's GPUs: %v", out)
	}
	out := h.signal(health.SignalXID, g0.UUID, 2*time.Second, causedBy149)
	wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Degraded, "XID145CausedByPeerGPU"))
	c := h.mustCondition(g0.UUID, health.ConditionXID, 145)
	if c.Evict || c.RecommendedAction != health.ActionInspect || !c.CausedByPrevious {
		t.Errorf("attributed condition %+v, want no eviction, inspect, CausedByPrevious", c)
	}
	if !strings.Contains(c.Message, "caused by XID 149 on GPU 2 ("+peerUUID+") of node nvl72-rack7-node3") {
		t.Errorf("message %q does not name the peer's GPU and node", c.Message)
	}
}

func TestAPeersLateReportAttributesAnXIDAlreadyRaised(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	// The peer's agent reports after its debounce: the XID comes first, and no root is known.
	out := h.signal(health.SignalXID, g0.UUID, 0, causedBy149)
	wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Unhealthy, "XID145"))
	// The peer's fault began a second before ours (the nodes' clocks differ) and is read 3 s later.
	out = h.setPeers(3*time.Second, peer149(-time.Second))
	wantTransitions(t, out, tr(g0.UUID, health.Unhealthy, health.Degraded, health.ReasonAttributedToPeer))
	if c := h.mustCondition(g0.UUID, health.ConditionXID, 145); c.Reason != "XID145CausedByPeerGPU" || c.Evict {
		t.Errorf("condition %+v, want XID145CausedByPeerGPU without eviction", c)
	}
	// The peer's fault clearing withdraws the attribution: the XID is its GPU's own again.
	out = h.setPeers(time.Minute)
	wantTransitions(t, out, tr(g0.UUID, health.Degraded, health.Unhealthy, "XID145"))
}

func TestPeerFaultsOutsideTheWindowOrNotTheCauseAreNotBlamed(t *testing.T) {
	g0, g1 := gpuDevice(0), gpuDevice(1)
	h := newHarness(t, health.DefaultPolicy(), g0, g1)
	w := health.DefaultRootCauseWindow
	// Too old, and too far ahead (a peer whose clock runs ahead by more than the window).
	h.setPeers(0, peer149(-w-time.Minute), peer149(w+time.Minute))
	out := h.signal(health.SignalXID, g0.UUID, 0, causedBy149)
	wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Unhealthy, "XID145"))
	// An XID no earlier one caused is the GPU's own, whatever the peers report.
	h.setPeers(time.Second, peer149(time.Second))
	out = h.signal(health.SignalXID, g1.UUID, 2*time.Second, withXID(145))
	wantTransitions(t, out, tr(g1.UUID, health.Healthy, health.Unhealthy, "XID145"))
}

func TestTheNamedCauseBeatsAMoreRecentFault(t *testing.T) {
	g0, g1 := gpuDevice(0), gpuDevice(1)
	h := newHarness(t, health.DefaultPolicy(), g0, g1)
	h.xid(g1.UUID, 79, 0) // this node's own fault, of another XID, more recent than the peer's
	h.setPeers(time.Second, peer149(-time.Second))
	h.signal(health.SignalXID, g0.UUID, 2*time.Second, causedBy149)
	if c := h.mustCondition(g0.UUID, health.ConditionXID, 145); c.Reason != "XID145CausedByPeerGPU" {
		t.Errorf("reason %q, want the peer's XID 149, which the driver named", c.Reason)
	}
}

func TestSetPeerFaultsDropsInvalidFaultsAndKeepsTheRest(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	bad := []health.PeerFault{
		{UUID: peerUUID, XID: 149, Since: at(0)},
		{Node: "n", XID: 149, Since: at(0)},
		{Node: "n", UUID: peerUUID, Since: at(0)},
		{Node: "n", UUID: peerUUID, XID: 149},
	}
	_, err := h.tr.SetPeerFaults(append(bad, peer149(0)), at(0), nil)
	if err == nil {
		t.Fatal("SetPeerFaults took four invalid faults without an error")
	}
	for _, want := range []string{"no node", "no GPU UUID", "XID 0", "no time"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	h.signal(health.SignalXID, g0.UUID, time.Second, causedBy149)
	if c := h.mustCondition(g0.UUID, health.ConditionXID, 145); c.Reason != "XID145CausedByPeerGPU" {
		t.Errorf("reason %q: the valid fault was not kept", c.Reason)
	}
}

func TestALocalRootStaysWhenPeersReport(t *testing.T) {
	g0, g1 := gpuDevice(0), gpuDevice(1)
	h := newHarness(t, health.DefaultPolicy(), g0, g1)
	h.xid(g1.UUID, 149, 0)
	h.signal(health.SignalXID, g0.UUID, time.Second, causedBy149)
	if out := h.setPeers(2*time.Second, peer149(time.Second)); len(out) != 0 {
		t.Errorf("a peer's report changed an XID already attributed to this node's GPU: %v", out)
	}
	if c := h.mustCondition(g0.UUID, health.ConditionXID, 145); c.Reason != "XID145CausedByGPU1" {
		t.Errorf("reason %q, want XID145CausedByGPU1", c.Reason)
	}
}

func TestALocalFaultAfterTheXIDIsNoRootWhenPeersReport(t *testing.T) {
	g0, g1 := gpuDevice(0), gpuDevice(1)
	h := newHarness(t, health.DefaultPolicy(), g0, g1)
	// GPU 0's caused-by XID, then at the same instant GPU 1's own fault: it came after, so it is
	// no root of GPU 0's; the peer's fault that arrives later is.
	h.signal(health.SignalXID, g0.UUID, 0, causedBy149)
	h.xid(g1.UUID, 145, 0)
	out := h.setPeers(time.Second, peer149(-time.Second))
	wantTransitions(t, out, tr(g0.UUID, health.Unhealthy, health.Degraded, health.ReasonAttributedToPeer))
	h.wantHealth(g1.UUID, health.Unhealthy, false)
}
