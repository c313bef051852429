package healthtest_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// fakeT records a Fatalf instead of ending the test, so that Eventually's failure is observable.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(f)
}

func TestEventuallyWaitsForAnotherGoroutine(t *testing.T) {
	var mu sync.Mutex
	done := false
	go func() {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		done = true
		mu.Unlock()
	}()
	healthtest.Eventually(t, "the goroutine", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return done
	})
}

func TestRecorderRecordsAndFilters(t *testing.T) {
	var r healthtest.Recorder
	at := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	go func() {
		r.Signal(health.XIDSignal("GPU-a", 79, at))
		r.Signal(health.Signal{Kind: health.SignalSample, Device: "GPU-b", Time: at})
		r.Reboot("boot-2", at)
		r.SetUnmonitored("GPU-b", true)
		r.SetPeerFaults([]health.PeerFault{{Node: "n", UUID: "GPU-p", XID: 149, Since: at}}, at)
	}()
	got := r.WaitSignals(t, "GPU-b's sample", healthtest.OfKind(health.SignalSample, "GPU-b"))
	if len(got) != 1 || got[0].Device != "GPU-b" {
		t.Errorf("signals %+v, want GPU-b's sample", got)
	}
	healthtest.Eventually(t, "the peer faults", func() bool { return len(r.PeerFaults()) == 1 })
	if xids := r.Signals(healthtest.OfKind(health.SignalXID, "")); len(xids) != 1 || xids[0].XID != 79 {
		t.Errorf("XID signals %+v", xids)
	}
	if all := r.Signals(); len(all) != 2 {
		t.Errorf("%d signals, want 2", len(all))
	}
	if b := r.Reboots(); len(b) != 1 || b[0] != "boot-2" {
		t.Errorf("reboots %q", b)
	}
	if u, marked := r.Unmonitored("GPU-b"); !u || !marked {
		t.Errorf("GPU-b unmonitored %v marked %v", u, marked)
	}
	if _, marked := r.Unmonitored("GPU-a"); marked {
		t.Error("GPU-a marked")
	}
}

func TestEventuallyFailsNamingWhatItWaitedFor(t *testing.T) {
	f := &fakeT{TB: t}
	func() {
		defer func() {
			if r := recover(); r != f {
				panic(r)
			}
		}()
		healthtest.EventuallyWithin(f, 20*time.Millisecond, "nothing", func() bool { return false })
	}()
	if !strings.Contains(f.failed, "waiting for nothing") {
		t.Errorf("Eventually failed with %q, want it to name what it waited for", f.failed)
	}
}
