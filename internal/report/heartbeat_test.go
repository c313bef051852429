package report_test

import (
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/report"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// TestHeartbeatsAreSpreadAndNeverTooOften: agents started together get different Late values,
// each within a quarter of the period, at least a second, so that no node writes more than once a
// period however its write time was truncated.
func TestHeartbeatsAreSpreadAndNeverTooOften(t *testing.T) {
	const period = 5 * time.Minute
	seen := map[time.Duration]bool{}
	for range 100 {
		h := report.NewHeartbeat(period)
		if h.Late < time.Second || h.Late > time.Second+period/4 {
			t.Fatalf("Late %v outside [1s, 1s+period/4]", h.Late)
		}
		seen[h.Late] = true
		written := time.Date(2026, 12, 2, 12, 0, 0, 999_000_000, time.UTC) // stored as 12:00:00
		value := gpuhealthv1.FormatHeartbeat(written)
		if next := h.Next(value); next.Sub(written) < period {
			t.Fatalf("next heartbeat %v after the write, less than the period", next.Sub(written))
		}
		if h.Due(value, h.Next(value).Add(-time.Millisecond)) || !h.Due(value, h.Next(value)) {
			t.Fatal("Due and Next disagree")
		}
	}
	if len(seen) < 50 {
		t.Errorf("only %d distinct Late values among 100 agents: heartbeats would bunch", len(seen))
	}
	if (report.Heartbeat{}).Due("", time.Now()) || !report.NewHeartbeat(0).Next("").IsZero() {
		t.Error("a heartbeat of period 0 is due")
	}
	if !report.NewHeartbeat(period).Due("garbage", time.Now()) {
		t.Error("an unreadable heartbeat is not due at once")
	}
}

// A heartbeat more than a period ahead of the agent's clock is rewritten at once (readers take it
// for stale, and it would otherwise stand until that time); a clock a little ahead is not.
func TestAHeartbeatInTheFutureIsRewritten(t *testing.T) {
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	h := report.Heartbeat{Period: 5 * time.Minute, Late: time.Second}
	for ahead, want := range map[time.Duration]bool{10 * time.Second: false, 5*time.Minute + time.Second: true, time.Hour: true, 365 * 24 * time.Hour: true} {
		if got := h.Due(gpuhealthv1.FormatHeartbeat(now.Add(ahead)), now); got != want {
			t.Errorf("Due with a heartbeat %v ahead = %v, want %v", ahead, got, want)
		}
	}
}
