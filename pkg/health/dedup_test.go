package health

import (
	"reflect"
	"testing"
	"time"
)

func TestDedup(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	type report struct {
		source string
		device string
		xid    uint32
		at     time.Duration
		want   bool
	}
	tests := []struct {
		name   string
		seq    []report
		counts map[string]DedupStats
	}{
		{
			name: "same XID from both sources within the window counts once, whichever comes first",
			seq: []report{
				{"nvml", "GPU-a", 79, 0, true},
				{"kmsg", "GPU-a", 79, -time.Second, false},
				{"kmsg", "GPU-b", 48, 10 * time.Second, true},
				{"nvml", "GPU-b", 48, 10*time.Second + 200*time.Millisecond, false},
			},
			counts: map[string]DedupStats{"nvml": {Reported: 2, Duplicates: 1}, "kmsg": {Reported: 2, Duplicates: 1}},
		},
		{
			name: "another GPU, another code, or outside the window is another XID",
			seq: []report{
				{"nvml", "GPU-a", 79, 0, true},
				{"kmsg", "GPU-b", 79, 0, true},
				{"kmsg", "GPU-a", 48, 0, true},
				{"kmsg", "GPU-a", 79, 6 * time.Second, true},
			},
			counts: map[string]DedupStats{"nvml": {Reported: 1}, "kmsg": {Reported: 3}},
		},
		{
			name: "one source repeating itself is never a duplicate",
			seq: []report{
				{"kmsg", "GPU-a", 13, 0, true},
				{"kmsg", "GPU-a", 13, 0, true},
			},
			counts: map[string]DedupStats{"kmsg": {Reported: 2}},
		},
		{
			name: "a storm seen by both pairs up one to one",
			seq: []report{
				{"nvml", "GPU-a", 13, 0, true},
				{"nvml", "GPU-a", 13, 100 * time.Millisecond, true},
				{"nvml", "GPU-a", 13, 200 * time.Millisecond, true},
				{"kmsg", "GPU-a", 13, 0, false},
				{"kmsg", "GPU-a", 13, 100 * time.Millisecond, false},
				{"kmsg", "GPU-a", 13, 200 * time.Millisecond, false},
				{"kmsg", "GPU-a", 13, 300 * time.Millisecond, true},
			},
			counts: map[string]DedupStats{"nvml": {Reported: 3}, "kmsg": {Reported: 4, Duplicates: 3}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDedup(5 * time.Second)
			for i, r := range tc.seq {
				s := Signal{Kind: SignalXID, Device: r.device, XID: r.xid, Time: t0.Add(r.at)}
				if got := d.Admit(r.source, s); got != r.want {
					t.Errorf("report %d (%+v): Admit = %v, want %v", i, r, got, r.want)
				}
			}
			if got := d.Stats(); !reflect.DeepEqual(got, tc.counts) {
				t.Errorf("Stats = %+v, want %+v", got, tc.counts)
			}
		})
	}
}

func TestDedupAdmitsEverySignalThatIsNotAnXID(t *testing.T) {
	d := NewDedup(0)
	s := Signal{Kind: SignalLost, Device: "GPU-a"}
	if !d.Admit("nvml", s) || !d.Admit("kmsg", s) {
		t.Error("a lost signal was dropped")
	}
	if len(d.Stats()) != 0 {
		t.Errorf("Stats = %+v, want no XIDs counted", d.Stats())
	}
}

// Keys whose reports all expired are forgotten, so a long run over many GPUs and XIDs does not
// grow without bound.
func TestDedupForgetsExpiredReports(t *testing.T) {
	d := NewDedup(time.Second)
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for i := range sweepEvery {
		d.Admit("nvml", Signal{Kind: SignalXID, Device: "GPU-a", XID: uint32(i + 1), Time: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// The sweep at the last report kept only the XIDs of its last second.
	if n := len(d.pending); n > 1001 {
		t.Errorf("%d keys pending after the sweep, want at most 1001", n)
	}
}
