package remediation

import (
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// A GPU whose fault keeps returning after repairs (health's ReplaceGPU escalation) is never
// reset again: its escalation clears only on an administrator's word, so a reset cannot help.
func TestAGPUToReplaceIsNeverReset(t *testing.T) {
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a"}})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	step := func(d time.Duration, s health.Signal) {
		s.Device, s.Time = "GPU-a", t0.Add(d)
		if _, err := tr.Observe(s, nil); err != nil {
			t.Fatal(err)
		}
	}
	xid48 := health.Signal{Kind: health.SignalXID, XID: 48}
	reset := health.Signal{Kind: health.SignalReset}
	step(0, xid48)
	if f := FactsOf(tr.Snapshot().Devices[0]); !f.NeedsReset {
		t.Fatalf("a first XID 48: %+v, want a reset", f)
	}
	step(time.Minute, reset)
	step(2*time.Minute, xid48)
	step(3*time.Minute, reset)
	step(4*time.Minute, xid48) // back after the second repair: ReplaceGPU
	f := FactsOf(tr.Snapshot().Devices[0])
	if !f.Unhealthy || f.NeedsReset {
		t.Errorf("facts %+v, want Unhealthy and no reset (ReplaceGPU)", f)
	}
}
