package kmsg

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

func TestOpenCompanionWarnsOnceWhereItCannotRead(t *testing.T) {
	var l healthtest.Log
	k := OpenCompanion(l.Context(), CompanionOptions{Path: "/nonexistent/kmsg", BootID: "b1"})
	if k.Up() {
		t.Error("Up with no kernel log")
	}
	if len(l.Lines()) != 1 || !strings.Contains(l.Lines()[0], "Warning: the kernel log is not read") || !strings.Contains(l.Lines()[0], "/nonexistent/kmsg") {
		t.Errorf("logged %q, want one warning naming the path", l.Lines())
	}
	// The backend runs alone.
	ran := false
	if err := k.Run(context.Background(), nil, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("Run = %v, backend ran %v", err, ran)
	}
	if err := k.Close(); err != nil {
		t.Error(err)
	}
}

func TestBackendXIDsTheKernelLogReportedCountOnce(t *testing.T) {
	dev := health.Device{UUID: "GPU-a", PCIBusID: "00000000:3B:00.0"}
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{dev})
	if err != nil {
		t.Fatal(err)
	}
	mon := health.NewMonitor(tr)
	k := NewCompanion()
	var observed []uint32
	at := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	// The kernel log's XID 79 arrives first; NVML's event for it 200ms later is a duplicate,
	// its XID 13 is not.
	if !k.dedup.Admit(SourceName, health.XIDSignal("GPU-a", 79, at)) {
		t.Fatal("the kernel log's XID was not admitted")
	}
	mon.Advance(SourceName, health.Cursor{BootID: "b1", Seq: 1}, health.XIDSignal("GPU-a", 79, at))
	sink := k.BackendFeed(mon, func(sig health.Signal) { observed = append(observed, sig.XID) })
	sink.Signal(health.XIDSignal("GPU-a", 79, at.Add(200*time.Millisecond)))
	sink.Signal(health.XIDSignal("GPU-a", 13, at.Add(300*time.Millisecond)))
	if !slices.Equal(observed, []uint32{13}) {
		t.Errorf("observed XIDs %v, want only the one applied (13)", observed)
	}
	counts := map[uint32]uint64{}
	for _, x := range tr.Snapshot().Devices[0].XIDs {
		counts[x.XID] = x.Count
	}
	if counts[79] != 1 || counts[13] != 1 {
		t.Errorf("XID counts = %v, want 79 once and 13 once", counts)
	}
	want := map[string]health.DedupStats{BackendSourceName: {Reported: 2, Duplicates: 1}, SourceName: {Reported: 1}}
	got := k.XIDSources()
	if len(got) != 2 || got[BackendSourceName] != want[BackendSourceName] || got[SourceName] != want[SourceName] {
		t.Errorf("XIDSources = %+v, want %+v", got, want)
	}
}

// On the real /dev/kmsg (skipped where it cannot be read): the source is up while it runs
// beside the backend, and a backend failure stops both.
func TestCompanionRunsBesideTheBackendOnTheRealDevice(t *testing.T) {
	var l healthtest.Log
	k := OpenCompanion(l.Context(), CompanionOptions{Path: DevKmsg, Devices: []health.Device{{UUID: "GPU-a"}}, BootID: "b1"})
	if !k.Up() {
		t.Skipf("cannot read %s: %q", DevKmsg, l.Lines())
	}
	defer k.Close()
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a"}})
	if err != nil {
		t.Fatal(err)
	}
	backendErr := context.DeadlineExceeded
	started := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- k.Run(context.Background(), health.NewMonitor(tr), func(ctx context.Context) error {
			close(started)
			<-release
			return backendErr
		})
	}()
	<-started
	if !k.Up() {
		t.Error("not up while running")
	}
	close(release)
	if err := <-done; !errors.Is(err, backendErr) {
		t.Errorf("Run = %v, want the backend's error", err)
	}
	if k.Up() {
		t.Error("still up after Run returned")
	}
}

// TestCompanionReopensAfterAReadError: a read error does not end the kernel log for good: it is
// reported down, opened again after a backoff, and read again (here a regular file, whose end is
// a read error for a reader of /dev/kmsg).
func TestCompanionReopensAfterAReadError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kmsg")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var l healthtest.Log
	k := OpenCompanion(l.Context(), CompanionOptions{Path: path, BootID: "b1"})
	if !k.Up() {
		t.Fatal("not up")
	}
	k.backoffInitial, k.backoffMax = time.Millisecond, 4*time.Millisecond
	tracker, err := health.NewTracker(health.DefaultPolicy(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mon := health.NewMonitor(tracker)
	ctx, cancel := context.WithCancel(l.Context())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx, mon, func(ctx context.Context) error { <-ctx.Done(); return nil }) }()
	for deadline := time.Now().Add(10 * time.Second); k.Reopens() < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d reopens in 10s", k.Reopens())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := k.Close(); err != nil {
		t.Error(err)
	}
	if len(l.Containing("Reading the kernel log again")) == 0 {
		t.Errorf("logged %q, want the reopening said", l.Lines())
	}
}
