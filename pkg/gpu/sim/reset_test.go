package sim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// running starts a Forever replay of sc on a fake clock and returns it with its recorder.
func running(t *testing.T, data string) (*sim.Backend, *recorder, *testingclock.FakeClock, chan error) {
	t.Helper()
	clk := testingclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	b := sim.New(mustParseScenario(t, data), sim.Options{Clock: clk, Forever: true, SampleInterval: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	rec := &recorder{}
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx, rec) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitForWaiters(t, clk, done)
	return b, rec, clk, done
}

func TestResetResetsTheSimulatedGPU(t *testing.T) {
	b, rec, clk, done := running(t, scenario("gpus: {count: 2}\n", "{at: 1s, gpu: 1, ecc: {uncorrectedVolatile: 3}}"))
	clk.Step(time.Second)
	waitForWaiters(t, clk, done)
	if err := b.Reset(t.Context(), gpu(1)); err != nil {
		t.Fatal(err)
	}
	resets := rec.of(health.SignalReset, gpu(1))
	if len(resets) != 1 || !resets[0].Time.Equal(clk.Now()) {
		t.Fatalf("reset signals %+v, want one now", resets)
	}
	if n := len(rec.of(health.SignalReset, gpu(0))); n != 0 {
		t.Fatalf("GPU 0 reset too (%d)", n)
	}
	waitForWaiters(t, clk, done)
	clk.Step(10 * time.Second)
	waitForWaiters(t, clk, done)
	ecc := rec.of(health.SignalECCCounters, gpu(1))
	if last := ecc[len(ecc)-1]; last.Uncorrected != 0 {
		t.Fatalf("uncorrected ECC %d after the reset, want 0", last.Uncorrected)
	}
}

func TestResetOfALostOrUnknownGPUFails(t *testing.T) {
	b, rec, clk, done := running(t, scenario("gpus: {count: 1}\n", "{at: 1s, gpu: 0, lost: true}"))
	clk.Step(time.Second)
	waitForWaiters(t, clk, done)
	if err := b.Reset(t.Context(), gpu(0)); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("reset of a lost GPU: %v", err)
	}
	if err := b.Reset(t.Context(), "GPU-nope"); err == nil || !strings.Contains(err.Error(), "no such GPU") {
		t.Fatalf("reset of an unknown GPU: %v", err)
	}
	if n := len(rec.of(health.SignalReset, gpu(0))); n != 0 {
		t.Fatalf("%d reset signals for a failed reset", n)
	}
}

func TestResetWithoutRunHonoursTheContext(t *testing.T) {
	b := sim.New(mustParseScenario(t, scenario("gpus: {count: 1}\n")), sim.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if err := b.Reset(ctx, gpu(0)); err == nil {
		t.Fatal("Reset returned nil with no replay running")
	}
}

func TestAfterResetFaultsFollowEveryReset(t *testing.T) {
	b, rec, clk, done := running(t, scenario("gpus: {count: 1}\n",
		"{at: 1s, gpu: 0, xid: 48}", "{afterReset: 3s, gpu: 0, xid: 48}"))
	clk.Step(time.Second)
	waitForWaiters(t, clk, done)
	for i := 1; i <= 2; i++ {
		if err := b.Reset(t.Context(), gpu(0)); err != nil {
			t.Fatal(err)
		}
		reset := clk.Now()
		waitForWaiters(t, clk, done)
		clk.Step(3 * time.Second)
		waitForWaiters(t, clk, done)
		xids := rec.of(health.SignalXID, gpu(0))
		if len(xids) != 1+i || !xids[i].Time.Equal(reset.Add(3*time.Second)) || xids[i].XID != 48 {
			t.Fatalf("after reset %d: XIDs %+v, want one 3s after the reset", i, xids)
		}
	}
}

func TestAfterResetScenarioEvents(t *testing.T) {
	rec, _ := replay(t, scenario("gpus: {count: 1}\n",
		"{at: 5s, gpu: 0, reset: true}", "{afterReset: 2s, gpu: 0, xid: 79}")+"duration: 20s\n", sim.Options{})
	xids := rec.of(health.SignalXID, gpu(0))
	if len(xids) != 1 || xids[0].Time.Sub(epoch) != 7*time.Second {
		t.Fatalf("XIDs %+v, want one at 7s", xids)
	}
}

func TestAfterResetValidation(t *testing.T) {
	for _, tc := range []struct{ event, want string }{
		{"{at: 1s, afterReset: 1s, gpu: 0, xid: 48}", "at and afterReset"},
		{"{afterReset: 1s, gpu: 0, reset: true}", "only faults"},
		{"{afterReset: -1s, gpu: 0, xid: 48}", "afterReset: must not be negative"},
		{"{afterReset: 200h, gpu: 0, xid: 48}", "past the longest scenario"},
	} {
		_, err := sim.ParseScenario([]byte(scenario("gpus: {count: 1}\n", tc.event)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.event, err, tc.want)
		}
	}
	// An afterReset storm counts against the scenario's limit on signals.
	events := []string{"{afterReset: 1s, gpu: 0, xid: 48, repeat: 10000000}"}
	for i := range 10 {
		events = append(events, fmt.Sprintf("{at: %ds, gpu: 0, xid: 48, repeat: 10000000}", i))
	}
	if _, err := sim.ParseScenario([]byte(scenario("gpus: {count: 1}\n", events...))); err == nil || !strings.Contains(err.Error(), "signals in all") {
		t.Errorf("110M signals with the afterReset storm: error %v", err)
	}
	if _, err := sim.ParseScenario([]byte(scenario("gpus: {count: 1}\n", events[1:]...))); err != nil {
		t.Errorf("100M signals without it: %v", err)
	}
}
