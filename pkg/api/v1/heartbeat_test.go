package v1_test

import (
	"strings"
	"testing"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// A heartbeat dated in the future keeps no stopped agent fresh: more than the bound ahead of the
// reader's clock it is stale; a clock a little ahead is forgiven.
func TestJudgeHeartbeatInTheFuture(t *testing.T) {
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	const bound = 15 * time.Minute
	for _, tc := range []struct {
		name          string
		at            time.Time
		stale, future bool
	}{
		{"fresh", now.Add(-time.Minute), false, false},
		{"old", now.Add(-16 * time.Minute), true, false},
		{"a clock a little ahead", now.Add(time.Minute), false, false},
		{"an hour ahead", now.Add(time.Hour), true, true},
		{"a year ahead", now.AddDate(1, 0, 0), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := gpuhealthv1.JudgeHeartbeat(map[string]string{gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(tc.at)}, now, bound)
			if s.Stale != tc.stale || s.Future != tc.future {
				t.Fatalf("JudgeHeartbeat(%v ahead) = %+v, want stale %v, future %v", tc.at.Sub(now), s, tc.stale, tc.future)
			}
			if tc.future && !strings.Contains(s.Describe(now), "heartbeat in the future") {
				t.Errorf("Describe = %q", s.Describe(now))
			}
		})
	}
}
