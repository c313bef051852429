package agent

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// peerGPU is a GPU UUID as NVML writes it, on a peer node.
const peerGPU = "GPU-9277d399-0674-44a9-b64e-d85bb19ce2b0"

func peerNode(name, health string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{gpuhealthv1.HealthKey: health}}}
}

// peerReport is a peer's gpu-health annotation with one GPU of health health and an XID fault
// on it that began at 10:00:00.
func peerReport(uuid, health string, xid int) string {
	return `{"` + uuid + `":{"index":2,"health":"` + health + `","xidFaults":[{"xid":` + strconv.Itoa(xid) + `,"since":"2026-12-02T10:00:00Z"}]}}`
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
	w := &peerResolver{monitor: m, clock: clk}
	w.forget()
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

	if w.peersMatter(m.Snapshot()) {
		t.Error("the peers matter with no XID at all")
	}
	read(peerNode("rack-n1", peerReport(peerGPU, "Unhealthy", 149)))
	gen := tr.Generation()
	read(peerNode("rack-n1", `{"`+peerGPU+`":{"index":2,"health":"Unhealthy","reasons":["XID149"],"xidFaults":[{"xid":149,"since":"2026-12-02T10:00:00Z"}]}}`))
	if tr.Generation() != gen {
		t.Error("a peer's report that changed nothing of its faults changed this node's state")
	}
	// A malformed report keeps the faults last read.
	read(peerNode("rack-n1", `{"GPU-p":`))
	caused("GPU-a", t0.Add(time.Second))
	if got := reason("GPU-a"); got != "XID145CausedByPeerGPU" {
		t.Errorf("after a malformed report, GPU-a's reason %q, want XID145CausedByPeerGPU", got)
	}
	// The attribution holds only while the peer reports the fault: the peers still matter.
	if !w.peersMatter(m.Snapshot()) {
		t.Error("the peers do not matter while an XID is attributed to one of their faults")
	}
	// A peer with no faults any more: nothing to blame, GPU-a's XID is its own again. GPU-b's
	// XID waits for its root until the window has passed.
	read(peerNode("rack-n1", `{"`+peerGPU+`":{"index":2,"health":"Healthy"}}`))
	if got := reason("GPU-a"); got != "XID145" {
		t.Errorf("after the peer's fault ended, GPU-a's reason %q, want XID145", got)
	}
	caused("GPU-b", t0.Add(2*time.Second))
	if got := reason("GPU-b"); got != "XID145" {
		t.Errorf("after the peer's fault ended, GPU-b's reason %q, want XID145", got)
	}
	if !w.peersMatter(m.Snapshot()) {
		t.Error("the peers do not matter while GPU-b's XID waits for its root")
	}
	clk.SetTime(t0.Add(2*time.Second + health.DefaultRootCauseWindow + time.Second))
	if w.peersMatter(m.Snapshot()) {
		t.Error("the peers still matter after the window")
	}
}

// TestPeerResolverAttributesOnlyToWhatAPeerCanBackAndTakesItBack runs the resolver's lookups
// against an API server (fake) where a node of the same NVLink domain writes what it likes in
// its report, as any node with the label can: a forged fault of another XID, a fault on a GPU
// its own report does not mark Unhealthy, or on a GPU whose UUID is 100 kB, explains nothing;
// a fault that does explain the XID stops explaining it when the report no longer has it; and
// what this agent logs of the peer's text is bounded.
func TestPeerResolverAttributesOnlyToWhatAPeerCanBackAndTakesItBack(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	policy := health.DefaultPolicy()
	rule := policy.XIDs[145]
	rule.Evict = true
	policy.XIDs[145] = rule
	tr, err := health.NewTracker(policy, []health.Device{{UUID: "GPU-a", Index: 0}})
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	domain := map[string]string{"nvidia.com/gpu.clique": "9277d399-0674-44a9-b64e-d85bb19ce2b0.32766"}
	self := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "nvl72-a-1", Labels: domain}}
	forger := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "nvl72-a-0", Labels: domain}}
	client := fake.NewClientset(self, forger)
	clk := clocktesting.NewFakeClock(t0.Add(2 * time.Second))
	w := &peerResolver{client: adapt.Clientset(client), nodes: nodecache.New(adapt.Clientset(client), self.Name),
		label: "nvidia.com/gpu.clique", monitor: m, clock: clk}
	w.forget()
	var logged []string
	ctx := klog.NewContext(t.Context(), funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{}))
	m.Signal(health.Signal{Kind: health.SignalXID, Device: "GPU-a", Time: t0.Add(time.Second), XID: 145,
		XIDFlags: health.XIDCausedByPrevious | health.XIDFatal, CauseXID: 149})

	for _, step := range []struct {
		name, report string
		want         health.Severity
		wantReason   string
	}{
		{"a forged fault of another XID", peerReport(peerGPU, "Unhealthy", 1), health.Unhealthy, "XID145"},
		{"the named XID on a Degraded GPU", peerReport(peerGPU, "Degraded", 149), health.Unhealthy, "XID145"},
		{"the named XID on a 100 kB UUID", peerReport("GPU-"+strings.Repeat("a", 100_000), "Unhealthy", 149), health.Unhealthy, "XID145"},
		{"a malformed report with a 100 kB number", `{"` + peerGPU + `":{"index":` + strings.Repeat("9", 100_000) + `}}`, health.Unhealthy, "XID145"},
		{"the named XID on an Unhealthy GPU", peerReport(peerGPU, "Unhealthy", 149), health.Degraded, "XID145CausedByPeerGPU"},
		{"the fault gone from the report", `{"` + peerGPU + `":{"index":2,"health":"Healthy"}}`, health.Unhealthy, "XID145"},
	} {
		forger.Annotations = map[string]string{gpuhealthv1.HealthKey: step.report}
		if _, err := client.CoreV1().Nodes().Update(ctx, forger, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if !w.peersMatter(m.Snapshot()) {
			t.Fatalf("%s: the peers do not matter", step.name)
		}
		w.lookup(ctx)
		d := m.Snapshot().Devices[0]
		if d.Health != step.want || d.Evict != (step.want == health.Unhealthy) || len(d.Conditions) != 1 || d.Conditions[0].Reason != step.wantReason {
			t.Errorf("%s: GPU-a %v evict %v conditions %+v, want %v with reason %s, evicting when Unhealthy", step.name, d.Health, d.Evict, d.Conditions, step.want, step.wantReason)
		}
	}
	refusals, malformed := 0, 0
	for _, line := range logged {
		if len(line) > 2048 {
			t.Errorf("a log line of %d bytes: %.200s...", len(line), line)
		}
		if strings.Contains(line, "Refusing faults of a peer's report") {
			refusals++
		}
		if strings.Contains(line, "Ignoring a peer's malformed report") {
			malformed++
		}
	}
	// A fault of another XID is no refusal: a valid fault, it explains nothing of this XID.
	if refusals != 2 || malformed != 1 {
		t.Errorf("%d refusals and %d malformed reports logged, want 2 (the Degraded GPU, the 100 kB UUID) and 1; log:\n%s", refusals, malformed, strings.Join(logged, "\n"))
	}
}
