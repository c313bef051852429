package nvsentinel_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/nvsentineltest"
)

// observer counts what a publisher reports.
type observer struct {
	mu      sync.Mutex
	sends   map[string]int
	pending int
}

func (o *observer) ObserveSend(result string, events int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sends[result]++
}

func (o *observer) ObservePending(n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pending = n
}

func (o *observer) get() (map[string]int, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return map[string]int{nvsentinel.ResultOK: o.sends[nvsentinel.ResultOK], nvsentinel.ResultError: o.sends[nvsentinel.ResultError],
		nvsentinel.ResultUnavailable: o.sends[nvsentinel.ResultUnavailable]}, o.pending
}

// rig is a publisher for 6 GPUs of node n1 on a fake clock, and the socket it sends to.
type rig struct {
	t      *testing.T
	ctx    context.Context
	clk    *clocktesting.FakeClock
	socket string
	pub    *nvsentinel.Publisher
	obs    *observer
	srv    *nvsentineltest.Server
}

func newRig(t *testing.T) *rig {
	_, ctx := ktesting.NewTestContext(t)
	r := &rig{t: t, ctx: ctx, clk: clocktesting.NewFakeClock(t0), socket: filepath.Join(t.TempDir(), "nvsentinel.sock"), obs: &observer{sends: map[string]int{}}}
	r.pub = nvsentinel.NewPublisher(nvsentinel.Options{
		MapOptions: nvsentinel.MapOptions{NodeName: "n1"}, Socket: r.socket, Clock: r.clk, Observer: r.obs,
		Backoff: wait.Backoff{Duration: time.Second, Factor: 2, Steps: 10, Cap: 8 * time.Second},
	})
	t.Cleanup(func() {
		_ = r.pub.Close()
		if r.srv != nil {
			r.srv.Stop()
		}
	})
	return r
}

// start starts (or restarts, with nothing received) the platform-connector.
func (r *rig) start() {
	r.t.Helper()
	if r.srv != nil {
		r.srv.Stop()
	}
	srv, err := nvsentineltest.Start(r.socket)
	if err != nil {
		r.t.Fatal(err)
	}
	r.srv = srv
}

func (r *rig) update(conds map[string][]health.Condition) {
	r.pub.Update(snap(devices(6), conds))
}

// flush flushes and returns what the server received in that flush, described.
func (r *rig) flush() ([]string, error) {
	r.t.Helper()
	before := 0
	if r.srv != nil {
		before = len(r.srv.Events())
	}
	err := r.pub.Flush(r.ctx)
	if r.srv == nil {
		return nil, err
	}
	var got []string
	for _, ev := range r.srv.Events()[before:] {
		got = append(got, describe(ev))
	}
	return got, err
}

// expect flushes and checks that exactly want arrived, in order.
func (r *rig) expect(what string, want ...string) {
	r.t.Helper()
	got, err := r.flush()
	if err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
	if !slices.Equal(got, want) {
		r.t.Fatalf("%s: received\n %q\nwant\n %q", what, got, want)
	}
}

const (
	gpu3   = "[GPU:3 PCI:0000:13:00 GPU_UUID:GPU-3]"
	gpu5   = "[GPU:5 PCI:0000:15:00 GPU_UUID:GPU-5]"
	xid79  = "fatal GpuHealthXID [79] " + gpu3 + " RESTART_BM"
	dbe5   = "fatal GpuHealthMemory [ECCUncorrected] " + gpu5 + " COMPONENT_RESET"
	twin5  = "healthy GpuHealthMemory [ECCUncorrected] " + gpu5 + " NONE"
	warm3  = "non-fatal GpuHealthThermal [Thermal] " + gpu3 + " NONE"
	twinW3 = "healthy GpuHealthThermal [Thermal] " + gpu3 + " NONE"
)

var (
	faultXID79 = map[string][]health.Condition{"GPU-3": {xid(79, health.Unhealthy, health.ActionRebootNode)}}
	bothFaults = map[string][]health.Condition{
		"GPU-3": {xid(79, health.Unhealthy, health.ActionRebootNode)},
		"GPU-5": {cond(health.ConditionECCUncorrected, health.Unhealthy, health.ActionResetGPU)},
	}
)

// startClears are the clears of the first send when GPU 3 has an XID and GPU 5 a memory fault:
// the checks without a fault as a whole, the two with one GPU by GPU.
func startClears() []string {
	var out []string
	for _, check := range nvsentinel.Checks() {
		switch check {
		case nvsentinel.CheckXID, nvsentinel.CheckMemory:
			for i := range 6 {
				if (check == nvsentinel.CheckXID && i == 3) || (check == nvsentinel.CheckMemory && i == 5) {
					continue
				}
				d := devices(6)[i]
				out = append(out, describe(&datamodels.HealthEvent{Version: 1, Agent: "gpuhealth", ComponentClass: "GPU", NodeName: "n1", IsHealthy: true,
					CheckName: check, EntitiesImpacted: nvsentinel.Entities(d), ProcessingStrategy: datamodels.ProcessingStrategy_EXECUTE_REMEDIATION}))
			}
		default:
			out = append(out, "healthy "+check+" [] [] NONE")
		}
	}
	return out
}

// TestDeliveryAcrossOutages follows the acceptance story on a real gRPC server: the socket is
// absent at first, then everything arrives once; a recovery sends its twin and nothing else; a
// restarted server gets the whole state again; what ended while it was away gets its twin.
func TestDeliveryAcrossOutages(t *testing.T) {
	r := newRig(t)
	r.update(bothFaults)
	if err := r.pub.Flush(r.ctx); !errors.Is(err, nvsentinel.ErrUnavailable) {
		t.Fatalf("Flush without a socket: %v, want ErrUnavailable", err)
	}
	if sends, pending := r.obs.get(); sends[nvsentinel.ResultUnavailable] != 1 || pending != len(startClears())+2 {
		t.Fatalf("without a socket: sends %v, pending %d", sends, pending)
	}
	if next := r.pub.NextAttempt(); !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("retry at %v, want 1s later", next.Sub(t0))
	}

	r.start()
	r.expect("within the backoff nothing is sent")
	r.clk.Step(time.Second)
	r.expect("the server is there", append(startClears(), xid79, dbe5)...)
	r.expect("nothing new: nothing sent")
	if sends, pending := r.obs.get(); sends[nvsentinel.ResultOK] != 1 || pending != 0 {
		t.Fatalf("after delivery: sends %v, pending %d", sends, pending)
	}
	if next := r.pub.NextAttempt(); !next.Equal(r.clk.Now().Add(nvsentinel.DefaultProbe)) {
		t.Fatalf("next check at %v, want a probe period later", next.Sub(r.clk.Now()))
	}

	r.clk.Step(time.Minute)
	r.update(faultXID79)
	r.expect("GPU 5 recovers: its twin, and GPU 3 stays", twin5)
	r.update(faultXID79)
	r.expect("the twin is sent once")

	r.start() // a restarted platform-connector knows nothing
	r.expect("a new server gets the whole state again", xid79)

	r.update(map[string][]health.Condition{"GPU-3": {xid(79, health.Unhealthy, health.ActionRebootNode), cond(health.ConditionThermal, health.Degraded, health.ActionCheckCooling)}})
	r.expect("a Degraded GPU sends only non-fatal", warm3)
	r.srv.Stop() // a crash: the socket file stays behind
	r.update(faultXID79)
	if _, err := r.flush(); err == nil {
		t.Fatal("a send to a stopped server succeeded")
	}
	r.start()
	r.clk.Step(time.Second)
	r.expect("after the outage: the twin of what ended while away, and the faults", twinW3, xid79)
	if sends, _ := r.obs.get(); sends[nvsentinel.ResultError] != 1 || sends[nvsentinel.ResultUnavailable] != 1 || sends[nvsentinel.ResultOK] != 5 {
		t.Errorf("sends %v", sends)
	}
}

// TestIdleProbeNoticesARestart: with nothing to send, a restart of the platform-connector is
// noticed at the next Flush (the agent's writer flushes every probe period), and everything is
// sent again.
func TestIdleProbeNoticesARestart(t *testing.T) {
	r := newRig(t)
	r.start()
	r.update(faultXID79)
	if got, err := r.flush(); err != nil || !slices.Contains(got, xid79) {
		t.Fatalf("first flush: %q %v", got, err)
	}
	r.expect("idle: nothing")
	r.start()
	r.clk.Step(nvsentinel.DefaultProbe)
	r.expect("the probe after a restart sends everything again", xid79)
	r.expect("and then nothing")
}

// TestFailedSendsAreRetriedWithBackoff: a server that refuses: retried at 1s, 2s, 4s; a fault that
// ended after a refused send still gets its twin (the refused send may have arrived).
func TestFailedSendsAreRetriedWithBackoff(t *testing.T) {
	r := newRig(t)
	r.start()
	r.update(nil)
	if got, err := r.flush(); err != nil || len(got) != len(nvsentinel.Checks()) {
		t.Fatalf("the clears at start: %q %v", got, err)
	}
	r.srv.Refuse(3)
	r.update(faultXID79)
	for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		if _, err := r.flush(); err == nil {
			t.Fatalf("refused send %d succeeded", i)
		}
		if next := r.pub.NextAttempt().Sub(r.clk.Now()); next != wait {
			t.Fatalf("after failure %d the retry is %v later, want %v", i+1, next, wait)
		}
		r.clk.Step(wait / 2)
		r.expect("within the backoff")
		r.clk.Step(wait / 2)
	}
	r.update(nil)
	r.expect("the fault ended after refused sends: its twin", "healthy GpuHealthXID [79] "+gpu3+" NONE")
	r.expect("then nothing")
}

// TestFatalToDegradedSendsTheTwinFirst: a non-fatal event does not end a fatal one in NVSentinel,
// so a fault that drops from Unhealthy to Degraded is ended first, then sent again as Degraded.
// A fault that comes back before its twin went out is sent as itself, without the twin.
func TestFatalToDegradedSendsTheTwinFirst(t *testing.T) {
	hot := func(sev health.Severity) map[string][]health.Condition {
		return map[string][]health.Condition{"GPU-3": {cond(health.ConditionThermal, sev, health.ActionCheckCooling)}}
	}
	r := newRig(t)
	r.start()
	r.update(hot(health.Unhealthy))
	if got, err := r.flush(); err != nil || got[len(got)-1] != "fatal GpuHealthThermal [Thermal] "+gpu3+" CONTACT_SUPPORT" {
		t.Fatalf("first flush: %q %v", got, err)
	}
	r.update(hot(health.Degraded))
	r.expect("down to Degraded", twinW3, warm3)
	r.update(hot(health.Unhealthy))
	r.expect("up again", "fatal GpuHealthThermal [Thermal] "+gpu3+" CONTACT_SUPPORT")

	r.srv.Refuse(1)
	r.update(nil)
	if _, err := r.flush(); err == nil {
		t.Fatal("refused send succeeded")
	}
	r.update(hot(health.Unhealthy))
	r.clk.Step(time.Second)
	r.expect("back before its twin went out: the fault alone (the connection failed, so it is sent again)", "fatal GpuHealthThermal [Thermal] "+gpu3+" CONTACT_SUPPORT")
}

// TestEventsKeepTheirTime: a resend carries the time the fault was first seen, so that it is the
// same event; a twin carries the time the fault ended.
func TestEventsKeepTheirTime(t *testing.T) {
	r := newRig(t)
	r.start()
	r.update(faultXID79)
	r.clk.Step(time.Minute)
	r.update(faultXID79)
	if _, err := r.flush(); err != nil {
		t.Fatal(err)
	}
	r.start()
	r.clk.Step(time.Hour)
	if _, err := r.flush(); err != nil {
		t.Fatal(err)
	}
	r.update(nil)
	if _, err := r.flush(); err != nil {
		t.Fatal(err)
	}
	events := r.srv.Events()
	if len(events) != 2 || events[0].GetGeneratedTimestamp().AsTime() != t0 || !events[1].IsHealthy ||
		events[1].GetGeneratedTimestamp().AsTime() != t0.Add(time.Minute+time.Hour) {
		for _, ev := range events {
			t.Logf("%s at %v", describe(ev), ev.GetGeneratedTimestamp().AsTime())
		}
		t.Fatal("want the resent fault at its first time, then its twin at the time it ended")
	}
}

// TestRunPublishesAMonitorsUpdates drives the embedder's loop from a real Monitor.
func TestRunPublishesAMonitorsUpdates(t *testing.T) {
	r := newRig(t)
	r.start()
	tracker, err := health.NewTracker(health.DefaultPolicy(), devices(6))
	if err != nil {
		t.Fatal(err)
	}
	mon := health.NewMonitor(tracker)
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan error, 1)
	sub := mon.Subscribe()
	defer sub.Close()
	go func() { done <- r.pub.Run(ctx, sub) }()

	has := func(want string) func([]*datamodels.HealthEvent) bool {
		return func(evs []*datamodels.HealthEvent) bool {
			return slices.ContainsFunc(evs, func(ev *datamodels.HealthEvent) bool { return strings.HasPrefix(describe(ev), want) })
		}
	}
	waitFor := func(what, want string) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		if evs, err := r.srv.Wait(wctx, has(want)); err != nil {
			t.Fatalf("%s: %v; received %d events", what, err, len(evs))
		}
	}
	waitFor("the clears at start", "healthy GpuHealthXID [] []")
	mon.Signal(health.Signal{Kind: health.SignalXID, Device: "GPU-3", Time: t0, XID: 79})
	waitFor("XID 79 on GPU 3", xid79)
	mon.Signal(health.Signal{Kind: health.SignalXID, Device: "GPU-5", Time: t0, XID: 48})
	waitFor("XID 48 on GPU 5", "fatal GpuHealthXID [48] "+gpu5+" COMPONENT_RESET")
	mon.Signal(health.Signal{Kind: health.SignalReset, Device: "GPU-5", Time: t0.Add(time.Minute)})
	waitFor("GPU 5 reset", "healthy GpuHealthXID [48] "+gpu5)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	for _, ev := range r.srv.Events() {
		if strings.Contains(describe(ev), gpu3) && ev.IsHealthy && len(ev.ErrorCode) > 0 {
			t.Errorf("GPU 3 was cleared: %s", describe(ev))
		}
	}
}
