package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// logged captures what a context's logger writes.
type logged struct {
	mu    sync.Mutex
	lines []string
}

func (l *logged) ctx() context.Context {
	return klog.NewContext(context.Background(), funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{}))
}

func on(path string) config.KernelLogConfig {
	yes := true
	return config.KernelLogConfig{Enabled: &yes, Path: path}
}

func TestOpenKernelLogWarnsOnceWhereItCannotRead(t *testing.T) {
	var l logged
	k := OpenKernelLog(l.ctx(), on("/nonexistent/kmsg"), nil, "b1")
	if k.Up() {
		t.Error("Up with no kernel log")
	}
	if len(l.lines) != 1 || !strings.Contains(l.lines[0], "Warning: the kernel log is not read") || !strings.Contains(l.lines[0], "/nonexistent/kmsg") {
		t.Errorf("logged %q, want one warning naming the path", l.lines)
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

func TestOpenKernelLogOffOpensNothing(t *testing.T) {
	var l logged
	no := false
	k := OpenKernelLog(l.ctx(), config.KernelLogConfig{Enabled: &no, Path: "/nonexistent/kmsg"}, nil, "b1")
	if k.Up() || len(l.lines) != 0 {
		t.Errorf("Up = %v, logged %q; want down and silent", k.Up(), l.lines)
	}
}

func TestBackendXIDsTheKernelLogReportedCountOnce(t *testing.T) {
	dev := health.Device{UUID: "GPU-a", PCIBusID: "00000000:3B:00.0"}
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{dev})
	if err != nil {
		t.Fatal(err)
	}
	mon := health.NewMonitor(tr)
	no := false
	k := OpenKernelLog(context.Background(), config.KernelLogConfig{Enabled: &no}, nil, "b1")
	at := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	// The kernel log's XID 79 arrives first; NVML's event for it 200ms later is a duplicate,
	// its XID 13 is not.
	if !k.dedup.Admit(kmsg.SourceName, health.XIDSignal("GPU-a", 79, at)) {
		t.Fatal("the kernel log's XID was not admitted")
	}
	mon.Advance(kmsg.SourceName, health.Cursor{BootID: "b1", Seq: 1}, health.XIDSignal("GPU-a", 79, at))
	sink := k.DedupSink(mon)
	sink.Signal(health.XIDSignal("GPU-a", 79, at.Add(200*time.Millisecond)))
	sink.Signal(health.XIDSignal("GPU-a", 13, at.Add(300*time.Millisecond)))
	counts := map[uint32]uint64{}
	for _, x := range tr.Snapshot().Devices[0].XIDs {
		counts[x.XID] = x.Count
	}
	if counts[79] != 1 || counts[13] != 1 {
		t.Errorf("XID counts = %v, want 79 once and 13 once", counts)
	}
	want := map[string]kmsg.DedupStats{BackendSource: {Reported: 2, Duplicates: 1}, kmsg.SourceName: {Reported: 1}}
	got := k.XIDSources()
	if len(got) != 2 || got[BackendSource] != want[BackendSource] || got[kmsg.SourceName] != want[kmsg.SourceName] {
		t.Errorf("XIDSources = %+v, want %+v", got, want)
	}
}

// On the real /dev/kmsg (skipped where it cannot be read): the source is up while it runs
// beside the backend, and a backend failure stops both.
func TestKernelLogRunsBesideTheBackendOnTheRealDevice(t *testing.T) {
	var l logged
	k := OpenKernelLog(l.ctx(), on(kmsg.DevKmsg), []health.Device{{UUID: "GPU-a"}}, "b1")
	if !k.Up() {
		t.Skipf("cannot read %s: %q", kmsg.DevKmsg, l.lines)
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

// TestKernelLogReopensAfterAReadError: a read error does not end the kernel log for good: it is
// reported down, opened again after a backoff, and read again (here a regular file, whose end is
// a read error for a reader of /dev/kmsg).
func TestKernelLogReopensAfterAReadError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kmsg")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var l logged
	k := OpenKernelLog(l.ctx(), on(path), nil, "b1")
	if !k.Up() {
		t.Fatal("not up")
	}
	k.backoffInitial, k.backoffMax = time.Millisecond, 4*time.Millisecond
	tracker, err := health.NewTracker(health.DefaultPolicy(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mon := health.NewMonitor(tracker)
	ctx, cancel := context.WithCancel(l.ctx())
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
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.ContainsFunc(l.lines, func(s string) bool { return strings.Contains(s, "Reading the kernel log again") }) {
		t.Errorf("logged %q, want the reopening said", l.lines)
	}
}
