package cli

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// fakeSession is an NVML session whose Run ends as the test says.
type fakeSession struct {
	devices []health.Device
	ends    chan error // what Run returns
	mu      sync.Mutex
	closed  bool
}

func newFakeSession(uuids ...string) *fakeSession {
	s := &fakeSession{ends: make(chan error, 1)}
	for i, u := range uuids {
		s.devices = append(s.devices, health.Device{UUID: u, Index: i})
	}
	return s
}

func (s *fakeSession) Devices() []health.Device { return s.devices }
func (s *fakeSession) DriverVersion() string    { return "535.261.03" }
func (s *fakeSession) Run(ctx context.Context, _ gpu.Sink) error {
	select {
	case err := <-s.ends:
		return err
	case <-ctx.Done():
		return nil
	}
}

func (s *fakeSession) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func (s *fakeSession) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

type nopSink struct{}

func (nopSink) Signal(health.Signal)               {}
func (nopSink) Reboot(string, time.Time)           {}
func (nopSink) SetUnmonitored(string, bool)        {}
func driverGone() error                            { return &gpunvml.DriverGoneError{Op: "test", At: time.Now()} }
func notLoaded() error                             { return &gpunvml.DriverError{Kind: gpunvml.ErrDriverNotLoaded} }
func notFound() error                              { return &gpunvml.DriverError{Kind: gpunvml.ErrLibraryNotFound} }
func stepUntilWaiting(clk *clocktesting.FakeClock) { stepWhenWaiting(clk, time.Second) }

func stepWhenWaiting(clk *clocktesting.FakeClock, d time.Duration) {
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clk.Step(d)
}

// driverLooks is what the driver root and NVML answer, one answer per look.
type driverLooks struct {
	mu      sync.Mutex
	changed []error // nil: unchanged; errChanged: another library; else the error
	opens   []error // nil: open the next session
	next    []*fakeSession
	probes  int
	probe   error
}

var errChanged = errors.New("changed")

func (d *driverLooks) changedFn() (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.changed) == 0 {
		return false, nil
	}
	e := d.changed[0]
	d.changed = d.changed[1:]
	if errors.Is(e, errChanged) {
		return true, nil
	}
	return false, e
}

func (d *driverLooks) openFn() (nvmlSession, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.opens) > 0 {
		e := d.opens[0]
		d.opens = d.opens[1:]
		if e != nil {
			return nil, e
		}
	}
	s := d.next[0]
	d.next = d.next[1:]
	return s, nil
}

func (d *driverLooks) probeFn(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.probes++
	return d.probe
}

func newReattaching(first *fakeSession, looks *driverLooks, clk *clocktesting.FakeClock) *reattachingBackend {
	return &reattachingBackend{current: first, devices: first.Devices(), open: looks.openFn, changed: looks.changedFn,
		probe: looks.probeFn, clock: clk, log: logr.Discard(), initial: time.Second, max: 4 * time.Second}
}

// The same library back: the plugin carries on in this process, on the same sink, after the
// driver was away for a while (the library missing, then NVML not loaded yet).
func TestReattachingBackendSameLibrary(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	first, second := newFakeSession("GPU-a", "GPU-b"), newFakeSession("GPU-b", "GPU-a")
	looks := &driverLooks{changed: []error{notFound(), nil, nil}, opens: []error{notLoaded()}, next: []*fakeSession{second}}
	r := newReattaching(first, looks, clk)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, nopSink{}) }()
	first.ends <- driverGone()
	for range 3 { // library missing, NVML not loaded, then open
		stepWhenWaiting(clk, 4*time.Second)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.currentSession() != nvmlSession(second) {
		if time.Now().After(deadline) {
			t.Fatal("the backend did not carry on on the driver that came back")
		}
		time.Sleep(time.Millisecond)
	}
	if !first.isClosed() {
		t.Error("the session the driver left was not closed")
	}
	if looks.probes != 0 {
		t.Errorf("%d child probes for the same library, want none", looks.probes)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v after its context ended, want nil", err)
	}
}

// Another library (an upgrade): once a child process opens NVML on it, only a new process can
// go on (errReexec); before that the plugin waits.
func TestReattachingBackendNewLibrary(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	first := newFakeSession("GPU-a")
	looks := &driverLooks{changed: []error{errChanged, errChanged}, probe: errors.New("not ready")}
	r := newReattaching(first, looks, clk)
	done := make(chan error, 1)
	go func() { done <- r.Run(t.Context(), nopSink{}) }()
	first.ends <- driverGone()
	stepUntilWaiting(clk)
	for {
		looks.mu.Lock()
		probed := looks.probes
		if probed == 1 {
			looks.probe = nil
		}
		looks.mu.Unlock()
		if probed == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Run = %v while the new driver was not ready", err)
	default:
	}
	stepWhenWaiting(clk, 2*time.Second)
	if err := <-done; !errors.Is(err, errReexec) {
		t.Errorf("Run = %v, want errReexec", err)
	}
}

// The driver back with other GPUs: a new process starts afresh; other errors end Run as they
// are.
func TestReattachingBackendOtherGPUsAndErrors(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	first, other := newFakeSession("GPU-a", "GPU-b"), newFakeSession("GPU-a")
	r := newReattaching(first, &driverLooks{next: []*fakeSession{other}}, clk)
	done := make(chan error, 1)
	go func() { done <- r.Run(t.Context(), nopSink{}) }()
	first.ends <- driverGone()
	stepUntilWaiting(clk)
	if err := <-done; !errors.Is(err, errReexec) || !other.isClosed() {
		t.Errorf("Run = %v (other session closed: %v), want errReexec and the session closed", err, other.isClosed())
	}

	migs := newFakeSession("GPU-a")
	r = newReattaching(migs, &driverLooks{}, clk)
	migs.ends <- &gpunvml.InventoryChangedError{GPU: "GPU-a"}
	if err := r.Run(t.Context(), nopSink{}); !errors.Is(err, errReexec) || !migs.isClosed() {
		t.Errorf("Run after a MIG change = %v (closed: %v), want errReexec and the session closed", err, migs.isClosed())
	}

	boom := errors.New("boom")
	third := newFakeSession("GPU-a")
	r = newReattaching(third, &driverLooks{}, clk)
	third.ends <- boom
	if err := r.Run(t.Context(), nopSink{}); !errors.Is(err, boom) {
		t.Errorf("Run = %v, want the backend's own error", err)
	}
}

// fakePause is the GPU operator's pause labels as the test sets them.
type fakePause struct {
	mu      sync.Mutex
	reason  string
	changed chan struct{}
}

func (p *fakePause) Reason(context.Context) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reason
}
func (p *fakePause) Changes() <-chan struct{} { return p.changed }
func (p *fakePause) set(reason string) {
	p.mu.Lock()
	p.reason = reason
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// marks records SetUnmonitored.
type marks struct {
	nopSink
	mu sync.Mutex
	m  map[string]bool
}

func (s *marks) SetUnmonitored(uuid string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[uuid] = on
}

func (s *marks) get(uuid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[uuid]
}

// The GPU operator's pause: the plugin shuts NVML down (the session closed, its devices
// unmonitored), does not look at the driver while the pause lasts, and carries on on the same
// library once it ends.
func TestReattachingBackendLetsGoWhileTheOperatorPauses(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	first, second := newFakeSession("GPU-a"), newFakeSession("GPU-a")
	looks := &driverLooks{next: []*fakeSession{second}}
	r := newReattaching(first, looks, clk)
	pause := &fakePause{changed: make(chan struct{}, 1)}
	r.pause = pause
	sink := &marks{m: map[string]bool{}}
	done := make(chan error, 1)
	go func() { done <- r.Run(t.Context(), sink) }()
	pause.set("the GPU operator paused GPU clients (nvidia.com/gpu.deploy.device-plugin=paused-for-driver-upgrade)")
	healthtest.Eventually(t, "the session closed for the pause", first.isClosed)
	healthtest.Eventually(t, "the devices unmonitored", func() bool { return sink.get("GPU-a") })
	clk.Step(time.Hour)
	time.Sleep(10 * time.Millisecond)
	if r.currentSession() != nvmlSession(first) {
		t.Fatal("NVML opened again while the operator still pauses GPU clients")
	}
	pause.set("")
	stepWhenWaiting(clk, time.Second)
	healthtest.Eventually(t, "the next session after the pause", func() bool { return r.currentSession() == nvmlSession(second) })
	select {
	case err := <-done:
		t.Fatalf("Run ended: %v", err)
	default:
	}
}
