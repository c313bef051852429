package sim_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

var epoch = time.Unix(0, 0).UTC()

// recorder is a gpu.Sink that keeps everything it receives.
type recorder struct {
	mu      sync.Mutex
	signals []health.Signal
	reboots []string
	// log interleaves signals and reboots in arrival order, for ordering checks.
	log []string
}

func (r *recorder) Signal(s health.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signals = append(r.signals, s)
	r.log = append(r.log, fmt.Sprintf("%v %s", s.Time.Sub(epoch), s.Kind))
}

func (r *recorder) Reboot(bootID string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reboots = append(r.reboots, fmt.Sprintf("%s@%v", bootID, at.Sub(epoch)))
	r.log = append(r.log, fmt.Sprintf("%v reboot", at.Sub(epoch)))
}

// SetUnmonitored: the simulator never calls it.
func (r *recorder) SetUnmonitored(string, bool) {}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.signals)
}

// of returns the signals of one kind for one device.
func (r *recorder) of(kind health.SignalKind, uuid string) []health.Signal {
	var out []health.Signal
	for _, s := range r.signals {
		if s.Kind == kind && s.Device == uuid {
			out = append(out, s)
		}
	}
	return out
}

func replay(t *testing.T, data string, opts sim.Options) (*recorder, *sim.Backend) {
	t.Helper()
	sc := mustParseScenario(t, data)
	opts.Virtual = true
	b := sim.New(sc, opts)
	rec := &recorder{}
	if err := b.Run(context.Background(), rec); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rec, b
}

func gpu(i int) string { return sim.GPUUUID("n1", i) }

func TestBackendIdentity(t *testing.T) {
	sc := mustParseScenario(t, scenario(""))
	b := sim.New(sc, sim.Options{})
	if b.NodeName() != "n1" || len(b.Devices()) != 6 || b.BootID() == "" {
		t.Fatalf("node %q devices %d boot %q", b.NodeName(), len(b.Devices()), b.BootID())
	}
	if want := 3 * sim.DefaultSampleEvery; b.End() != want {
		t.Fatalf("End() = %v, want three default sampling rounds (%v)", b.End(), want)
	}
}

func TestSamplingRounds(t *testing.T) {
	rec, _ := replay(t, scenario("gpus: {count: 2}\n")+"duration: 30s\n", sim.Options{SampleInterval: 10 * time.Second})
	// Rounds at 0, 10, 20 and 30s for both GPUs, each ending with a sample marker.
	for i := range 2 {
		var at []time.Duration
		for _, s := range rec.of(health.SignalSample, gpu(i)) {
			at = append(at, s.Time.Sub(epoch))
		}
		if want := []time.Duration{0, 10 * time.Second, 20 * time.Second, 30 * time.Second}; !slices.Equal(at, want) {
			t.Fatalf("GPU %d sample rounds at %v, want %v", i, at, want)
		}
	}
	// A round reports every reading of an idle GPU, as NVML would.
	var kinds []string
	for _, s := range rec.signals {
		if s.Device == gpu(0) && s.Time.Equal(epoch) {
			kinds = append(kinds, s.Kind.String())
		}
	}
	want := []string{"eccCounters", "remappedRows", "retiredPages", "temperature", "clockEvents", "pcieReplays", "recoveryAction", "sample"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("round %q, want %q", kinds, want)
	}
	temp := rec.of(health.SignalTemperature, gpu(0))[0]
	if temp.Value != sim.IdleTemperatureC || temp.SlowdownC != 90 || temp.ShutdownC != 95 {
		t.Fatalf("idle temperature %+v, want %d°C with thresholds 90/95", temp, sim.IdleTemperatureC)
	}
}

func TestEventsComeBeforeTheRoundOfTheSameInstant(t *testing.T) {
	rec, _ := replay(t, scenario("gpus: {count: 1}\n",
		"{at: 0s, gpu: 0, xid: 13}",
		"{at: 10s, gpu: 0, xid: 13}",
		"{at: 15s, gpu: 0, reset: true}",
	)+"duration: 20s\n", sim.Options{SampleInterval: 10 * time.Second})
	var got []string
	for _, l := range rec.log {
		if strings.HasSuffix(l, " xid") || strings.HasSuffix(l, " reset") || strings.HasSuffix(l, " sample") {
			got = append(got, l)
		}
	}
	want := []string{"0s sample", "0s xid", "10s xid", "10s sample", "15s reset", "20s sample"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %q, want %q", got, want)
	}
}

func TestCountersAccumulateAndResetClearsThem(t *testing.T) {
	rec, _ := replay(t, scenario("gpus: {count: 1}\n",
		"{at: 1s, gpu: 0, pcieReplays: 500}",
		"{at: 2s, gpu: 0, pcieReplays: 250}",
		"{at: 3s, gpu: 0, ecc: {correctedVolatile: 10, uncorrectedVolatile: 1}}",
		"{at: 4s, gpu: 0, ecc: {correctedVolatile: 5}}",
		"{at: 5s, gpu: 0, nvlink: {link: 3, crcErrors: 7}}",
		"{at: 6s, gpu: 0, nvlink: {link: 3, crcErrors: 8}}",
		"{at: 7s, gpu: 0, nvlink: {link: 1, down: true}}",
		"{at: 8s, gpu: 0, remappedRows: {pending: true}}",
		"{at: 8s, gpu: 0, retiredPages: {pending: true}}",
		"{at: 8s, gpu: 0, recoveryAction: gpuReset}",
		"{at: 15s, gpu: 0, reset: true}",
	)+"duration: 20s\n", sim.Options{SampleInterval: 10 * time.Second})
	valuesAt := func(kind health.SignalKind, d time.Duration, pick func(health.Signal) string) []string {
		var out []string
		for _, s := range rec.of(kind, gpu(0)) {
			if s.Time.Equal(epoch.Add(d)) {
				out = append(out, pick(s))
			}
		}
		return out
	}
	value := func(s health.Signal) string { return fmt.Sprint(s.Value) }
	cases := []struct {
		name string
		got  []string
		want []string
	}{
		// PCIe replay and NVLink error counters are polled only, as with NVML: nothing between
		// rounds, the new total in the next round, and a baseline for every link from the start.
		{"no pcie signal at the event", valuesAt(health.SignalPCIeReplays, 2*time.Second, value), nil},
		{"no nvlink error signal at the event", valuesAt(health.SignalNVLinkErrors, 5*time.Second, value), nil},
		{"nvlink baselines in the first round", valuesAt(health.SignalNVLinkErrors, 0, func(s health.Signal) string { return fmt.Sprint(s.Link, ":", s.Value) }), []string{"1:0", "3:0"}},
		{"nvlink state at the event", valuesAt(health.SignalNVLinkState, 7*time.Second, func(s health.Signal) string { return fmt.Sprint(s.Link, ":", s.Down) }), []string{"1:true"}},
		{"pcie in the round", valuesAt(health.SignalPCIeReplays, 10*time.Second, value), []string{"750"}},
		{"pcie after the reset", valuesAt(health.SignalPCIeReplays, 20*time.Second, value), []string{"0"}},
		{"ecc event totals", valuesAt(health.SignalECCCounters, 4*time.Second, func(s health.Signal) string { return fmt.Sprint(s.Corrected, s.Uncorrected) }), []string{"15 1"}},
		{"ecc after the reset", valuesAt(health.SignalECCCounters, 20*time.Second, func(s health.Signal) string { return fmt.Sprint(s.Corrected, s.Uncorrected) }), []string{"0 0"}},
		{"nvlink errors per link", valuesAt(health.SignalNVLinkErrors, 10*time.Second, func(s health.Signal) string { return fmt.Sprint(s.Link, ":", s.Value) }), []string{"1:0", "3:15"}},
		{"nvlink state per link", valuesAt(health.SignalNVLinkState, 10*time.Second, func(s health.Signal) string { return fmt.Sprint(s.Link, ":", s.Down) }), []string{"1:true", "3:false"}},
		{"nvlink after the reset", valuesAt(health.SignalNVLinkState, 20*time.Second, func(s health.Signal) string { return fmt.Sprint(s.Link, ":", s.Down) }), []string{"1:false", "3:false"}},
		{"rows pending in the round", valuesAt(health.SignalRemappedRows, 10*time.Second, func(s health.Signal) string { return fmt.Sprint(s.Pending, s.Failure) }), []string{"true false"}},
		{"rows after the reset", valuesAt(health.SignalRemappedRows, 20*time.Second, func(s health.Signal) string { return fmt.Sprint(s.Pending, s.Failure) }), []string{"false false"}},
		{"pages after the reset", valuesAt(health.SignalRetiredPages, 20*time.Second, func(s health.Signal) string { return fmt.Sprint(s.Pending) }), []string{"false"}},
		{"recovery action in the round", valuesAt(health.SignalRecoveryAction, 10*time.Second, func(s health.Signal) string { return s.Action.String() }), []string{"gpuReset"}},
		{"recovery action after the reset", valuesAt(health.SignalRecoveryAction, 20*time.Second, func(s health.Signal) string { return s.Action.String() }), []string{"none"}},
		{"the reset itself", valuesAt(health.SignalReset, 15*time.Second, func(s health.Signal) string { return "reset" }), []string{"reset"}},
	}
	for _, tc := range cases {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

func TestReadingsAreHeldUntilChanged(t *testing.T) {
	rec, _ := replay(t, scenario("gpus: {count: 1}\n",
		"{at: 5s, gpu: 0, temperatureC: 97}",
		"{at: 5s, gpu: 0, clockEventReasons: [hwPowerBrake]}",
		"{at: 25s, gpu: 0, temperatureC: 40}",
		"{at: 25s, gpu: 0, clockEventReasons: []}",
	)+"duration: 30s\n", sim.Options{SampleInterval: 10 * time.Second})
	var temps, clocks []string
	for _, s := range rec.of(health.SignalTemperature, gpu(0)) {
		temps = append(temps, fmt.Sprintf("%v=%d", s.Time.Sub(epoch), s.Value))
	}
	for _, s := range rec.of(health.SignalClockEvents, gpu(0)) {
		clocks = append(clocks, fmt.Sprintf("%v=%s", s.Time.Sub(epoch), s.Reasons))
	}
	if want := []string{"0s=35", "5s=97", "10s=97", "20s=97", "25s=40", "30s=40"}; !slices.Equal(temps, want) {
		t.Errorf("temperatures %q, want %q", temps, want)
	}
	if want := []string{"0s=", "5s=hwPowerBrake", "10s=hwPowerBrake", "20s=hwPowerBrake", "25s=", "30s="}; !slices.Equal(clocks, want) {
		t.Errorf("clock reasons %q, want %q", clocks, want)
	}
}

func TestXIDScopes(t *testing.T) {
	rec, _ := replay(t, scenario("",
		fmt.Sprintf("{at: 1s, gpu: %s, xid: 43}", sim.MIGUUID("n1", 1, 2)),
		"{at: 2s, gpu: 1, xid: 62, gpuInstance: 1}",
		"{at: 3s, gpu: 1, xid: 62, gpuInstance: 1, computeInstance: 0}",
		"{at: 4s, gpu: 1, xid: 48}",
		"{at: 5s, gpu: 2, xid: 31, repeat: 3}",
	), sim.Options{})
	var got []string
	for _, s := range rec.signals {
		if s.Kind != health.SignalXID {
			continue
		}
		g := "-"
		if s.MIGScoped {
			g = fmt.Sprintf("gi%d/ci%d", s.GPUInstance, int32(s.ComputeInstance))
		}
		got = append(got, fmt.Sprintf("%s %d %s", s.Device, s.XID, g))
	}
	want := []string{
		gpu(1) + " 43 gi2/ci0", // an XID on a MIG UUID is reported on the parent with the instance IDs, as NVML does
		gpu(1) + " 62 gi1/ci-1",
		gpu(1) + " 62 gi1/ci0",
		gpu(1) + " 48 -",
		gpu(2) + " 31 -", gpu(2) + " 31 -", gpu(2) + " 31 -",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("XID signals\n%q\nwant\n%q", got, want)
	}
}

func TestLostGPUAnswersOnlyLost(t *testing.T) {
	rec, b := replay(t, scenario("gpus: {count: 2}\n",
		"{at: 5s, gpu: 0, lost: true}",
		"{at: 6s, gpu: 0, temperatureC: 99}",
		"{at: 7s, gpu: 0, xid: 79}",
		"{at: 8s, gpu: 0, reset: true}",
		"{at: 15s, reboot: true}",
	)+"duration: 20s\n", sim.Options{SampleInterval: 10 * time.Second})
	var got []string
	for _, s := range rec.signals {
		if s.Device == gpu(0) && s.Time.After(epoch.Add(4*time.Second)) {
			got = append(got, fmt.Sprintf("%v %s", s.Time.Sub(epoch), s.Kind))
		}
	}
	want := []string{"5s lost", "6s lost", "7s xid", "8s lost", "10s lost"}
	if len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
		t.Fatalf("signals of the lost GPU %q, want %q first", got, want)
	}
	// After the reboot the GPU is back and sampled normally.
	var after []string
	for _, s := range rec.of(health.SignalSample, gpu(0)) {
		after = append(after, s.Time.Sub(epoch).String())
	}
	if !slices.Equal(after, []string{"0s", "20s"}) {
		t.Fatalf("sample rounds of GPU 0 %q, want 0s and 20s", after)
	}
	if len(rec.reboots) != 1 || rec.reboots[0] != b.BootID()+"@15s" || b.BootID() == "n1-boot-0" {
		t.Fatalf("reboots %q, boot ID now %q", rec.reboots, b.BootID())
	}
}

func TestRebootRestoresIdleReadingsButNotARemapFailure(t *testing.T) {
	rec, _ := replay(t, scenario("gpus: {count: 1}\n",
		"{at: 1s, gpu: 0, temperatureC: 99}",
		"{at: 1s, gpu: 0, remappedRows: {failure: true, pending: true}}",
		"{at: 1s, gpu: 0, pcieReplays: 10}",
		"{at: 1s, gpu: 0, nvlink: {link: 4, crcErrors: 10}}",
		"{at: 5s, reboot: true}",
	)+"duration: 10s\n", sim.Options{SampleInterval: 10 * time.Second})
	at10 := func(kind health.SignalKind) health.Signal {
		for _, s := range rec.of(kind, gpu(0)) {
			if s.Time.Equal(epoch.Add(10 * time.Second)) {
				return s
			}
		}
		t.Fatalf("no %s at 10s", kind)
		return health.Signal{}
	}
	if s := at10(health.SignalTemperature); s.Value != sim.IdleTemperatureC {
		t.Errorf("temperature after reboot %d", s.Value)
	}
	if s := at10(health.SignalRemappedRows); !s.Failure || s.Pending {
		t.Errorf("rows after reboot %+v, want the failure kept and nothing pending", s)
	}
	if s := at10(health.SignalPCIeReplays); s.Value != 0 {
		t.Errorf("pcie after reboot %d", s.Value)
	}
	if s := at10(health.SignalNVLinkErrors); s.Link != 4 || s.Value != 0 {
		t.Errorf("NVLink errors after reboot %+v, want link 4 still sampled, from zero", s)
	}
}

func TestReplayStopsAtTheEnd(t *testing.T) {
	cases := []struct {
		name     string
		data     string
		opts     sim.Options
		lastTime time.Duration
	}{
		{"settle after the last event", scenario("gpus: {count: 1}\n", "{at: 12s, gpu: 0, xid: 13}"), sim.Options{SampleInterval: 10 * time.Second}, 40 * time.Second},
		{"explicit settle", scenario("gpus: {count: 1}\n", "{at: 12s, gpu: 0, xid: 13}"), sim.Options{SampleInterval: 10 * time.Second, Settle: 5 * time.Second}, 12 * time.Second},
		{"duration", scenario("gpus: {count: 1}\n", "{at: 12s, gpu: 0, xid: 13}") + "duration: 1m\n", sim.Options{SampleInterval: 10 * time.Second}, time.Minute},
		{"duration off the sampling grid", scenario("gpus: {count: 1}\n") + "duration: 25s\n", sim.Options{SampleInterval: 10 * time.Second}, 20 * time.Second},
		{"an event at the very end", scenario("gpus: {count: 1}\n", "{at: 25s, gpu: 0, xid: 13}") + "duration: 25s\n", sim.Options{SampleInterval: 10 * time.Second}, 25 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec, _ := replay(t, tc.data, tc.opts)
			last := rec.signals[len(rec.signals)-1].Time.Sub(epoch)
			if last != tc.lastTime {
				t.Fatalf("last signal at %v, want %v", last, tc.lastTime)
			}
		})
	}
}

func TestVirtualStart(t *testing.T) {
	start := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)
	sc := mustParseScenario(t, scenario("gpus: {count: 1}\n", "{at: 3s, gpu: 0, xid: 13}"))
	rec := &recorder{}
	if err := sim.New(sc, sim.Options{Virtual: true, Start: start}).Run(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	xids := rec.of(health.SignalXID, gpu(0))
	if len(xids) != 1 || !xids[0].Time.Equal(start.Add(3*time.Second)) {
		t.Fatalf("XID at %v, want %v", xids, start.Add(3*time.Second))
	}
}

func TestAnHourOfScenarioReplays(t *testing.T) {
	var events []string
	for m := range 60 {
		events = append(events, fmt.Sprintf("{at: %dm, gpu: %d, xid: 31, repeat: 100}", m, m%8))
	}
	rec, _ := replay(t, scenario("gpus: {count: 8}\n", events...)+"duration: 1h\n", sim.Options{})
	// 361 rounds of 8 GPUs and 6000 XIDs.
	if got := len(rec.of(health.SignalSample, gpu(7))); got != 361 {
		t.Fatalf("%d rounds, want 361", got)
	}
	n := 0
	for _, s := range rec.signals {
		if s.Kind == health.SignalXID {
			n++
		}
	}
	if n != 6000 {
		t.Fatalf("%d XIDs, want 6000", n)
	}
}

func TestVirtualReplayStopsWhenCancelled(t *testing.T) {
	sc := mustParseScenario(t, scenario("gpus: {count: 1}\n")+"duration: 1h\n")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := sim.New(sc, sim.Options{Virtual: true}).Run(ctx, &recorder{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
}

// waitForWaiters blocks until the backend waits on the fake clock. It synchronises with the
// replay goroutine; it asserts nothing about time.
func waitForWaiters(t *testing.T, c *testingclock.FakeClock, done <-chan error) {
	t.Helper()
	for !c.HasWaiters() {
		select {
		case err := <-done:
			t.Fatalf("replay ended early: %v", err)
		default:
			time.Sleep(time.Millisecond)
		}
	}
}

func TestRealClockReplay(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(start)
	sc := mustParseScenario(t, scenario("gpus: {count: 1}\n", "{at: 5s, gpu: 0, xid: 48}")+"duration: 10s\n")
	rec := &recorder{}
	done := make(chan error, 1)
	go func() {
		done <- sim.New(sc, sim.Options{Clock: clk, SampleInterval: 10 * time.Second}).Run(context.Background(), rec)
	}()

	waitForWaiters(t, clk, done)
	// The round at the start came at once; nothing else until the clock moves.
	if n := rec.count(); n != 8 {
		t.Fatalf("%d signals before the clock moved, want the first round (8)", n)
	}
	clk.Step(5 * time.Second)
	waitForWaiters(t, clk, done)
	clk.Step(5 * time.Second)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	xids := rec.of(health.SignalXID, gpu(0))
	if len(xids) != 1 || !xids[0].Time.Equal(start.Add(5*time.Second)) {
		t.Fatalf("XID %+v, want one at start+5s", xids)
	}
	samples := rec.of(health.SignalSample, gpu(0))
	if len(samples) != 2 || !samples[1].Time.Equal(start.Add(10*time.Second)) {
		t.Fatalf("samples %+v", samples)
	}
}

func TestRealClockReplayCancelled(t *testing.T) {
	for _, forever := range []bool{false, true} {
		t.Run(fmt.Sprintf("forever=%v", forever), func(t *testing.T) {
			clk := testingclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			sc := mustParseScenario(t, scenario("gpus: {count: 1}\n")+"duration: 1h\n")
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- sim.New(sc, sim.Options{Clock: clk, Forever: forever}).Run(ctx, &recorder{}) }()
			waitForWaiters(t, clk, done)
			cancel()
			err := <-done
			if forever && err != nil {
				t.Fatalf("Run with Forever: %v, want nil on cancellation", err)
			}
			if !forever && !errors.Is(err, context.Canceled) {
				t.Fatalf("Run: %v, want context.Canceled", err)
			}
		})
	}
}

func TestForeverKeepsSamplingPastTheEnd(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	sc := mustParseScenario(t, scenario("gpus: {count: 1}\n")+"duration: 10s\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{}
	done := make(chan error, 1)
	go func() {
		done <- sim.New(sc, sim.Options{Clock: clk, Forever: true, SampleInterval: 10 * time.Second}).Run(ctx, rec)
	}()
	for range 5 {
		waitForWaiters(t, clk, done)
		clk.Step(10 * time.Second)
	}
	waitForWaiters(t, clk, done)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(rec.of(health.SignalSample, gpu(0))); n != 6 {
		t.Fatalf("%d rounds, want 6 (0s to 50s, past the 10s duration)", n)
	}
}

// peerRecorder is a recorder that takes the peers' faults.
type peerRecorder struct {
	recorder
	sets [][]health.PeerFault
}

func (r *peerRecorder) SetPeerFaults(faults []health.PeerFault, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sets = append(r.sets, faults)
}

func TestPeerFaultsReachOnlyASinkThatTakesThem(t *testing.T) {
	data := scenario("gpus: {count: 1}\n",
		"{at: 1s, peerFault: {node: n0, gpu: 2, xid: 149}}",
		"{at: 2s, peerFault: {node: n0, gpu: 3, xid: 79}}",
		"{at: 3s, peerFault: {node: n0, gpu: 2, xid: 149, cleared: true}}")
	sc := mustParseScenario(t, data)
	rec := &peerRecorder{}
	if err := sim.New(sc, sim.Options{Virtual: true}).Run(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, set := range rec.sets {
		var s []string
		for _, f := range set {
			s = append(s, fmt.Sprintf("%s/%d/%d@%v", f.Node, f.Index, f.XID, f.Since.Sub(epoch)))
		}
		got = append(got, strings.Join(s, ","))
	}
	want := []string{"n0/2/149@1s", "n0/2/149@1s,n0/3/79@2s", "n0/3/79@2s"}
	if !slices.Equal(got, want) {
		t.Errorf("peer fault sets %q, want %q", got, want)
	}
	// An agent's sink takes no peers from a scenario: it reads them from the API server.
	err := sim.New(sc, sim.Options{Virtual: true}).Run(context.Background(), &recorder{})
	if err == nil || !strings.Contains(err.Error(), "peerFault events are replayed by gpuhealth simulate only") {
		t.Errorf("Run on a sink without peers: %v", err)
	}
}
