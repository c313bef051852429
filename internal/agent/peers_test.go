package agent

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func peerNode(name, health string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{gpuhealthv1.HealthKey: health}}}
}

// TestPeerResolverKeepsAPeersFaultsThroughAMalformedReport feeds the resolver peers' reports as
// its lookups would and checks what the monitor attributes to them, and when it looks up.
func TestPeerResolverKeepsAPeersFaultsThroughAMalformedReport(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}})
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	clk := clocktesting.NewFakeClock(t0)
	w := &peerResolver{monitor: m, clock: clk, faults: map[string][]health.PeerFault{}, bad: map[string]string{}}
	ctx := context.Background()
	read := func(n *corev1.Node) {
		w.read(ctx, n)
		w.publish(ctx)
	}
	caused := func(uuid string, at time.Time) {
		m.Signal(health.Signal{Kind: health.SignalXID, Device: uuid, Time: at, XID: 145, XIDFlags: health.XIDCausedByPrevious, CauseXID: 149})
	}
	reason := func(uuid string) string {
		for _, d := range m.Snapshot().Devices {
			if d.Device.UUID == uuid && len(d.Conditions) > 0 {
				return d.Conditions[0].Reason
			}
		}
		return ""
	}

	if w.waiting(m.Snapshot()) {
		t.Error("waiting for a root with no XID at all")
	}
	read(peerNode("rack-n1", `{"GPU-p":{"index":2,"health":"Unhealthy","xidFaults":[{"xid":149,"since":"2026-12-02T10:00:00Z"}]}}`))
	gen := tr.Generation()
	read(peerNode("rack-n1", `{"GPU-p":{"index":2,"health":"Unhealthy","reasons":["XID149"],"xidFaults":[{"xid":149,"since":"2026-12-02T10:00:00Z"}]}}`))
	if tr.Generation() != gen {
		t.Error("a peer's report that changed nothing of its faults changed this node's state")
	}
	// A malformed report keeps the faults last read.
	read(peerNode("rack-n1", `{"GPU-p":`))
	caused("GPU-a", t0.Add(time.Second))
	if got := reason("GPU-a"); got != "XID145CausedByPeerGPU" {
		t.Errorf("after a malformed report, GPU-a's reason %q, want XID145CausedByPeerGPU", got)
	}
	if w.waiting(m.Snapshot()) {
		t.Error("waiting for a root although the XID is attributed")
	}
	// A peer with no faults any more: nothing to blame. The XID waits for its root until the
	// window has passed.
	read(peerNode("rack-n1", `{"GPU-p":{"index":2,"health":"Healthy"}}`))
	caused("GPU-b", t0.Add(2*time.Second))
	if got := reason("GPU-b"); got != "XID145" {
		t.Errorf("after the peer's fault ended, GPU-b's reason %q, want XID145", got)
	}
	if !w.waiting(m.Snapshot()) {
		t.Error("not waiting for GPU-b's root")
	}
	clk.SetTime(t0.Add(2*time.Second + health.DefaultRootCauseWindow + time.Second))
	if w.waiting(m.Snapshot()) {
		t.Error("still waiting for GPU-b's root after the window")
	}
}
