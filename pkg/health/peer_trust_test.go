package health_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Another node of the NVLink domain writes its own report, and may lie in it: these tests hold
// what a peer's fault may and may not do to this node's XIDs.

// evictingPolicy is the default policy with XID 145 evicting, as the review's was when one
// forged peer fault turned it into Degraded with no eviction.
func evictingPolicy() *health.Policy {
	p := health.DefaultPolicy()
	r := p.XIDs[145]
	r.Evict = true
	p.XIDs[145] = r
	return p
}

func TestOnlyAPeerFaultOfTheXIDTheDriverNamedIsARoot(t *testing.T) {
	forged := peer149(0)
	forged.XID = 1
	namesNone := func(s *health.Signal) {
		s.XID, s.XIDFlags, s.CauseXID = 145, health.XIDCausedByPrevious|health.XIDFatal, 0
	}
	for _, tc := range []struct {
		name  string
		peer  health.PeerFault
		xid   func(*health.Signal)
		first bool // the peer's report comes before the XID
	}{
		{"another XID, reported first", forged, causedBy149, true},
		{"another XID, reported late", forged, causedBy149, false},
		{"no XID named, reported first", peer149(0), namesNone, true},
		{"no XID named, reported late", peer149(0), namesNone, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g0 := gpuDevice(0)
			h := newHarness(t, evictingPolicy(), g0)
			if tc.first {
				h.setPeers(0, tc.peer)
			}
			out := h.signal(health.SignalXID, g0.UUID, time.Second, tc.xid)
			wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Unhealthy, "XID145"))
			if !tc.first {
				if out := h.setPeers(2*time.Second, tc.peer); len(out) != 0 {
					t.Errorf("the peer's fault changed this node's XID: %v", out)
				}
			}
			h.wantHealth(g0.UUID, health.Unhealthy, true)
		})
	}
}

func TestWithdrawingThePeerFaultWithdrawsTheAttribution(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, evictingPolicy(), g0)
	h.setPeers(0, peer149(0))
	out := h.signal(health.SignalXID, g0.UUID, 2*time.Second, causedBy149)
	wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Degraded, "XID145CausedByPeerGPU"))

	// The peer no longer reports the fault: the XID is its GPU's own again, under its rule.
	out = h.setPeers(time.Minute)
	wantTransitions(t, out, tr(g0.UUID, health.Degraded, health.Unhealthy, "XID145"))
	h.wantHealth(g0.UUID, health.Unhealthy, true)
	c := h.mustCondition(g0.UUID, health.ConditionXID, 145)
	if c.Reason != "XID145" || c.RecommendedAction != health.ActionResetGPU || strings.Contains(c.Message, "caused by") || !c.CausedByPrevious {
		t.Errorf("withdrawn condition %+v, want XID 145's own rule (reset, no cause in the message), still caused by an earlier XID", c)
	}
	if !c.Since.Equal(at(2*time.Second)) || !c.LastSeen.Equal(at(2*time.Second)) {
		t.Errorf("withdrawn condition since %v last seen %v, want both the XID's time: a withdrawal is no new sighting", c.Since, c.LastSeen)
	}
	if hist := h.status(g0.UUID).History; len(hist) != 1 || hist[0].Kind != health.HistoryFault || !hist[0].Time.Equal(at(time.Minute)) {
		t.Errorf("history %+v, want the fault recorded when the attribution was withdrawn", hist)
	}

	// Reported again (within the window of the XID): attributed again.
	out = h.setPeers(2*time.Minute, peer149(0))
	wantTransitions(t, out, tr(g0.UUID, health.Unhealthy, health.Degraded, health.ReasonAttributedToPeer))
}

func TestAnAttributionMovesToAnotherFaultOfTheNamedXID(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, evictingPolicy(), g0)
	other := peer149(time.Second)
	other.Node, other.UUID, other.Index = "nvl72-rack7-node4", "GPU-0d5e1f7c-4a4b-4c1e-9a55-7ad3f2b7c001", 0
	h.setPeers(0, peer149(0), other)
	h.signal(health.SignalXID, g0.UUID, 2*time.Second, causedBy149)
	if c := h.mustCondition(g0.UUID, health.ConditionXID, 145); !strings.HasSuffix(c.Message, "of node nvl72-rack7-node4") {
		t.Fatalf("message %q, want the most recent fault of XID 149 named", c.Message)
	}
	// The named fault ends; the other one still explains the XID.
	if out := h.setPeers(time.Minute, peer149(0)); len(out) != 0 {
		t.Errorf("the attribution moving to another peer fault changed health: %v", out)
	}
	h.wantHealth(g0.UUID, health.Degraded, false)
	if c := h.mustCondition(g0.UUID, health.ConditionXID, 145); !strings.HasSuffix(c.Message, "("+peerUUID+") of node nvl72-rack7-node3") {
		t.Errorf("message %q still names a fault no peer reports", c.Message)
	}
}

// A restarted agent has its conditions back from the checkpoint, attributions included; they
// are checked against the peers' faults as any other.
func TestAnAttributionRestoredFromACheckpointIsCheckedAgainstThePeers(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, evictingPolicy(), g0)
	h.tr.SetBootID("boot-1")
	h.setPeers(0, peer149(0))
	h.signal(health.SignalXID, g0.UUID, 2*time.Second, causedBy149)
	cp := h.tr.Checkpoint()
	ignores145 := health.DefaultPolicy()
	ignores145.XIDs[145] = health.XIDRule{Severity: health.Healthy, ClearsOn: health.ClearsOnGPUReset, Action: health.ActionRestartApplication}
	for _, tc := range []struct {
		name      string
		policy    *health.Policy
		peers     []health.PeerFault
		want      health.Severity
		wantEvict bool
	}{
		{"the fault still reported", evictingPolicy(), []health.PeerFault{peer149(0)}, health.Degraded, false},
		{"the fault gone", evictingPolicy(), nil, health.Unhealthy, true},
		{"a fault of another XID on the same GPU", evictingPolicy(), []health.PeerFault{{Node: "nvl72-rack7-node3", UUID: peerUUID, Index: 2, XID: 1, Since: at(0)}}, health.Unhealthy, true},
		{"the fault gone, under a policy that ignores the XID", ignores145, nil, health.Healthy, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := restoreInto(t, tc.policy, cp, "boot-1", g0)
			r.wantHealth(g0.UUID, health.Degraded, false)
			r.setPeers(time.Hour+time.Second, tc.peers...)
			r.wantHealth(g0.UUID, tc.want, tc.wantEvict)
		})
	}
}

func TestSetPeerFaultsRefusesWhatNoNodeOrGPUIsNamed(t *testing.T) {
	huge := "GPU-" + strings.Repeat("a", 100_000)
	for _, tc := range []struct {
		name string
		mod  func(*health.PeerFault)
		want string
	}{
		{"a UUID that is no UUID", func(p *health.PeerFault) { p.UUID = "GPU-peer-2" }, `"GPU-peer-2" is no GPU UUID`},
		{"a 100 kB UUID", func(p *health.PeerFault) { p.UUID = huge }, "100004 bytes"},
		{"a MIG instance's UUID", func(p *health.PeerFault) { p.UUID = "MIG" + peerUUID[3:] }, "is no GPU UUID"},
		{"a UUID with a newline", func(p *health.PeerFault) { p.UUID = peerUUID[:39] + "\n" }, `\n" is no GPU UUID`},
		{"a node name no node has", func(p *health.PeerFault) { p.Node = "Rack 7" }, `"Rack 7" is no node name`},
		{"a node name longer than Kubernetes allows", func(p *health.PeerFault) { p.Node = strings.Repeat("n", 254) }, "254 bytes"},
		{"a negative index", func(p *health.PeerFault) { p.Index = -1 }, "index -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g0 := gpuDevice(0)
			h := newHarness(t, evictingPolicy(), g0)
			bad := peer149(0)
			tc.mod(&bad)
			_, err := h.tr.SetPeerFaults([]health.PeerFault{bad}, at(0), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("SetPeerFaults error %v, want one saying %q", err, tc.want)
			}
			if len(err.Error()) > 512 {
				t.Errorf("the error is %d bytes: a peer's text reaches the log unbounded", len(err.Error()))
			}
			out := h.signal(health.SignalXID, g0.UUID, time.Second, causedBy149)
			wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Unhealthy, "XID145"))
		})
	}
}

func TestAPeersTextIsBoundedInThisNodesMessagesAndErrors(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, evictingPolicy(), g0)
	longest := peer149(0)
	longest.Node = strings.Repeat("n", 253)
	h.setPeers(0, longest)
	h.signal(health.SignalXID, g0.UUID, time.Second, causedBy149)
	c := h.mustCondition(g0.UUID, health.ConditionXID, 145)
	if c.Reason != "XID145CausedByPeerGPU" || len(c.Message) > 400 {
		t.Errorf("attributed to the longest node name Kubernetes allows: reason %q, message of %d bytes", c.Reason, len(c.Message))
	}
	// Ten thousand refusals make one bounded error, not one line each.
	many := make([]health.PeerFault, 10_000)
	for i := range many {
		many[i] = peer149(0)
		many[i].UUID = "GPU-" + strings.Repeat("b", 1000)
	}
	_, err := h.tr.SetPeerFaults(many, at(2*time.Second), nil)
	if err == nil {
		t.Fatal("SetPeerFaults took ten thousand 1 kB UUIDs without an error")
	}
	if len(err.Error()) > 4096 || !strings.Contains(err.Error(), "and 9992 more") {
		t.Errorf("error of %d bytes (want at most 4096, counting those left out): %.300v", len(err.Error()), err)
	}
}
