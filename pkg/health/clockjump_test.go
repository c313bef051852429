package health_test

import (
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// TestClockJumps drives the tracker with signal times that step back and forward, as after an
// NTP step or a VM restored from a snapshot: recovery must neither stall until the old clock is
// reached again nor happen early because of the step back, and no rate is invented across a step.
func TestClockJumps(t *testing.T) {
	p := health.DefaultPolicy()
	base := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	newTracker := func(t *testing.T) *health.Tracker {
		tr, err := health.NewTracker(p, []health.Device{{UUID: "GPU-0"}})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	healthOf := func(tr *health.Tracker) health.Severity { return tr.Snapshot().Devices[0].Health }
	observe := func(t *testing.T, tr *health.Tracker, s health.Signal) {
		t.Helper()
		s.Device = "GPU-0"
		if _, err := tr.Observe(s, nil); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("hysteresis recovers across a step back", func(t *testing.T) {
		tr := newTracker(t)
		observe(t, tr, health.Signal{Kind: health.SignalTemperature, Value: 97, Time: base})
		observe(t, tr, health.Signal{Kind: health.SignalTemperature, Value: 50, Time: base.Add(10 * time.Second)})
		// The clock steps back an hour; the next clean samples must still count.
		back := base.Add(-time.Hour)
		observe(t, tr, health.Signal{Kind: health.SignalTemperature, Value: 50, Time: back})
		observe(t, tr, health.Signal{Kind: health.SignalTemperature, Value: 50, Time: back.Add(10 * time.Second)})
		if h := healthOf(tr); h != health.Healthy {
			t.Errorf("after %d clean samples across a clock step: %v, want Healthy", p.Thermal.RecoverySamples, h)
		}
	})

	t.Run("quiet period restarts on a step back", func(t *testing.T) {
		tr := newTracker(t)
		observe(t, tr, health.XIDSignal("GPU-0", 92, base)) // Degraded until a quiet period
		back := base.Add(-24 * time.Hour)
		observe(t, tr, health.Signal{Kind: health.SignalSample, Time: back})
		if h := healthOf(tr); h != health.Degraded {
			t.Fatalf("a step back ended the quiet period: %v", h)
		}
		observe(t, tr, health.Signal{Kind: health.SignalSample, Time: back.Add(p.QuietPeriod - time.Second)})
		if h := healthOf(tr); h != health.Degraded {
			t.Fatalf("quiet period ended early: %v", h)
		}
		observe(t, tr, health.Signal{Kind: health.SignalSample, Time: back.Add(p.QuietPeriod)})
		if h := healthOf(tr); h != health.Healthy {
			t.Errorf("quiet period did not end on the new clock: %v", h)
		}
	})

	t.Run("no rate across a step back", func(t *testing.T) {
		tr := newTracker(t)
		observe(t, tr, health.Signal{Kind: health.SignalPCIeReplays, Value: 0, Time: base})
		// 100 replays reported a second "before" the baseline: not a rate of any kind.
		observe(t, tr, health.Signal{Kind: health.SignalPCIeReplays, Value: 100, Time: base.Add(-time.Second)})
		if h := healthOf(tr); h != health.Healthy {
			t.Fatalf("a rate was computed across a clock step: %v", h)
		}
		// Measured again from the new baseline: 100 more in a minute is above 60/min.
		observe(t, tr, health.Signal{Kind: health.SignalPCIeReplays, Value: 200, Time: base.Add(59 * time.Second)})
		if h := healthOf(tr); h != health.Degraded {
			t.Errorf("rate after the new baseline not measured: %v", h)
		}
	})

	t.Run("a step forward only ages what it should", func(t *testing.T) {
		tr := newTracker(t)
		observe(t, tr, health.XIDSignal("GPU-0", 79, base))
		observe(t, tr, health.Signal{Kind: health.SignalSample, Time: base.Add(365 * 24 * time.Hour)})
		if h := healthOf(tr); h != health.Unhealthy {
			t.Errorf("a year forward cleared a fault that waits for a reboot: %v", h)
		}
	})
}
