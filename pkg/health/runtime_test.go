package health_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// runtimeFixture runs a Runtime on a fake clock until the test ends.
type runtimeFixture struct {
	t     *testing.T
	clock *clocktesting.FakeClock
	rt    *health.Runtime
	path  string
	done  chan error
}

func newRuntime(t *testing.T, p *health.Policy, bootID, path string) *runtimeFixture {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	rt, err := health.NewRuntime(p, []health.Device{gpuDevice(0), gpuDevice(1)},
		health.RuntimeOptions{Clock: clk, CheckpointPath: path, BootID: bootID})
	if err != nil {
		t.Fatal(err)
	}
	return &runtimeFixture{t: t, clock: clk, rt: rt, path: path}
}

// run starts Run with feed; the test's end stops it and waits for it.
func (f *runtimeFixture) run(feed func(context.Context, *health.Monitor) error) {
	ctx, cancel := context.WithCancel(context.Background())
	f.done = make(chan error, 1)
	go func() { f.done <- f.rt.Run(ctx, feed) }()
	f.t.Cleanup(func() {
		cancel()
		if err := <-f.done; err != nil {
			f.t.Errorf("Run after cancel = %v, want nil", err)
		}
	})
	f.waitForTicker()
}

// waitForTicker waits until Run waits on the fake clock again.
func (f *runtimeFixture) waitForTicker() {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f.clock.HasWaiters() {
		if time.Now().After(deadline) {
			f.t.Fatal("Run never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// step advances the fake clock one tick at a time by d.
func (f *runtimeFixture) step(d time.Duration) {
	f.t.Helper()
	for range int(d / health.DefaultTickInterval) {
		f.clock.Step(health.DefaultTickInterval)
		f.waitForTicker()
	}
}

func (f *runtimeFixture) health(i int) health.Severity {
	return f.rt.Monitor().Snapshot().Devices[i].Health
}

func TestRuntimeTicksOnItsClock(t *testing.T) {
	p := health.DefaultPolicy()
	p.QuietPeriod = time.Minute
	f := newRuntime(t, p, "boot-1", "")
	f.run(nil)
	f.rt.Monitor().Signal(health.XIDSignal(gpuDevice(0).UUID, 92, t0))
	if got := f.health(0); got != health.Degraded {
		t.Fatalf("after XID 92: %v, want Degraded", got)
	}
	// Only ticks end a quiet period: nothing else happens here.
	f.step(59 * time.Second)
	if got := f.health(0); got != health.Degraded {
		t.Fatalf("59s into a 1m quiet period: %v, want Degraded", got)
	}
	f.step(time.Second)
	healthtest.Eventually(t, "the quiet period to end on the fake clock", func() bool { return f.health(0) == health.Healthy })
}

func TestRuntimeSavesOnChangeAndRestoresAfterARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	f := newRuntime(t, health.DefaultPolicy(), "boot-1", path)
	f.run(nil)
	uuid := gpuDevice(1).UUID
	f.rt.Monitor().Signal(health.XIDSignal(uuid, 79, t0))
	healthtest.Eventually(t, "a checkpoint naming GPU 1", func() bool {
		cp, err := health.ReadCheckpoint(path)
		return err == nil && len(cp.Devices) == 1 && cp.Devices[0].Device.UUID == uuid && cp.BootID == "boot-1"
	})
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// Changes that leave the sticky state as it was (a polled reading, a tick) write nothing.
	f.rt.Monitor().Signal(health.Signal{Kind: health.SignalTemperature, Device: gpuDevice(0).UUID, Time: t0.Add(time.Second), Value: 95})
	f.step(3 * time.Second)
	if st2, err := os.Stat(path); err != nil || !st2.ModTime().Equal(st.ModTime()) || st2.Size() != st.Size() {
		t.Fatalf("checkpoint rewritten without a sticky change (%v)", err)
	}

	// The restarted process, same boot: the XID comes back before anything runs.
	g := newRuntime(t, health.DefaultPolicy(), "boot-1", path)
	restored, err := g.rt.Restore()
	if err != nil || !restored {
		t.Fatalf("Restore = %v, %v; want true, nil", restored, err)
	}
	if got := g.health(1); got != health.Unhealthy {
		t.Fatalf("restored GPU 1 is %v, want Unhealthy", got)
	}

	// After a reboot XID 79 (cleared by a reboot) does not come back, and the next checkpoint
	// names the new boot; GPU 1's history keeps the fault and the reboot that repaired it.
	h := newRuntime(t, health.DefaultPolicy(), "boot-2", path)
	if _, err := h.rt.Restore(); err != nil {
		t.Fatal(err)
	}
	if got := h.health(1); got != health.Healthy {
		t.Fatalf("GPU 1 after a reboot is %v, want Healthy", got)
	}
	h.run(nil)
	healthtest.Eventually(t, "a checkpoint of boot-2", func() bool {
		cp, err := health.ReadCheckpoint(path)
		return err == nil && cp.BootID == "boot-2" && len(cp.Devices) == 1 && len(cp.Devices[0].Conditions) == 0 &&
			len(cp.Devices[0].History) == 2 && cp.Devices[0].History[0].Kind == health.HistoryFault &&
			cp.Devices[0].History[0].Reason == "XID79" && cp.Devices[0].History[1].Kind == health.HistoryReboot
	})
}

func TestRuntimeRestoreIgnoresNothingAndKeepsStateOnABadCheckpoint(t *testing.T) {
	dir := t.TempDir()
	missing := newRuntime(t, health.DefaultPolicy(), "b", filepath.Join(dir, "none.json"))
	if restored, err := missing.rt.Restore(); restored || err != nil {
		t.Fatalf("Restore of a missing file = %v, %v; want false, nil", restored, err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"version":1,"checksum":"sha256:00","data":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newRuntime(t, health.DefaultPolicy(), "b", bad)
	restored, err := f.rt.Restore()
	if restored || !errors.Is(err, health.ErrCorruptCheckpoint) {
		t.Fatalf("Restore of a corrupt file = %v, %v; want false and ErrCorruptCheckpoint", restored, err)
	}
	if got := f.health(0); got != health.Healthy {
		t.Fatalf("after a corrupt checkpoint GPU 0 is %v, want Healthy", got)
	}
}

func TestRuntimeRunsTheFeedAndStopsOnItsError(t *testing.T) {
	f := newRuntime(t, health.DefaultPolicy(), "b", "")
	boom := errors.New("backend broke")
	ctx := context.Background()
	err := f.rt.Run(ctx, func(_ context.Context, m *health.Monitor) error {
		m.Signal(health.XIDSignal(gpuDevice(0).UUID, 79, t0))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want the feed's error", err)
	}
	if got := f.health(0); got != health.Unhealthy {
		t.Fatalf("GPU 0 = %v, want Unhealthy (the feed's signal)", got)
	}
}

func TestRuntimeKeepsTickingAfterTheFeedEnds(t *testing.T) {
	p := health.DefaultPolicy()
	p.QuietPeriod = 2 * time.Second
	f := newRuntime(t, p, "b", "")
	fed := make(chan struct{})
	f.run(func(_ context.Context, m *health.Monitor) error {
		m.Signal(health.XIDSignal(gpuDevice(0).UUID, 92, t0))
		close(fed)
		return nil // a scenario that ended
	})
	<-fed
	f.step(2 * time.Second)
	healthtest.Eventually(t, "ticks after the feed ended", func() bool { return f.health(0) == health.Healthy })
}

// TestRuntimeRetriesAFailedCheckpointEveryTick: a checkpoint write that fails is counted, leaves
// the runtime "unsaved" (embedders report not ready) and is tried again at every tick, not only at
// the next change: the fault it holds reaches the disk once the disk lets it.
func TestRuntimeRetriesAFailedCheckpointEveryTick(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "state")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	path := filepath.Join(blocker, "checkpoint.json")
	f := newRuntime(t, health.DefaultPolicy(), "boot-1", path)
	f.run(nil)
	f.rt.Monitor().Signal(health.XIDSignal(gpuDevice(0).UUID, 79, t0))
	healthtest.Eventually(t, "the failed write counted", func() bool { return f.rt.CheckpointFailures() >= 1 })
	if f.rt.CheckpointSaved() {
		t.Fatal("CheckpointSaved after a failed write")
	}
	before := f.rt.CheckpointFailures()
	f.step(health.DefaultTickInterval)
	healthtest.Eventually(t, "a retry at the tick", func() bool { return f.rt.CheckpointFailures() > before })

	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	f.step(health.DefaultTickInterval)
	healthtest.Eventually(t, "saved at the next tick", f.rt.CheckpointSaved)
	cp, err := health.ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(cp.Devices) == 0 {
		t.Errorf("the checkpoint holds no device: %+v", cp)
	}
}
