package deviceapi_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpuhealth/gpuhealth/pkg/deviceapi"
	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/deviceapitest"
	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/v1alpha1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// callTimeout bounds every call a test makes, so that a server that blocks fails the test
// instead of hanging it.
const callTimeout = 30 * time.Second

// serveSocket serves m on a socket in a fresh directory until the test ends, logging into log,
// and returns the socket's path; stop stops the server and returns what ServeSocket returned.
func serveSocket(t *testing.T, m *health.Monitor, opts deviceapi.Options, log *healthtest.Log) (path string, stop func() error) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "device-api.sock")
	ctx, cancel := context.WithCancel(log.Context())
	done := make(chan error, 1)
	go func() { done <- deviceapi.New(m, opts).ServeSocket(ctx, deviceapi.SocketOptions{Path: path}) }()
	stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("ServeSocket: %v", err)
		}
	})
	return path, stop
}

// dial is deviceapitest.Dial.
var dial = deviceapitest.Dial

func callContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// watch opens a watch on c.
func watch(t *testing.T, c v1alpha1.GpuServiceClient) grpc.ServerStreamingClient[v1alpha1.WatchGpusResponse] {
	t.Helper()
	w, err := c.WatchGpus(callContext(t), &v1alpha1.WatchGpusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// next receives one event and describes it as "TYPE summary".
func next(t *testing.T, w grpc.ServerStreamingClient[v1alpha1.WatchGpusResponse]) string {
	t.Helper()
	ev, err := w.Recv()
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	return ev.GetType() + " " + summary(ev.GetObject())
}

func TestListAndGetServeEveryGPU(t *testing.T) {
	devs := gpus(3, true)
	m := newMonitor(t, devs)
	m.Signal(health.XIDSignal(devs[2].UUID, 48, t0))
	path, _ := serveSocket(t, m, deviceapi.Options{}, &healthtest.Log{})
	c := dial(t, path)
	ctx := callContext(t)

	list, err := c.ListGpus(ctx, &v1alpha1.ListGpusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range list.GetGpuList().GetItems() {
		got = append(got, summary(g))
	}
	want := []string{
		strings.ToLower(devs[0].UUID) + " Ready=True/Healthy",
		strings.ToLower(devs[1].UUID) + " Ready=True/Healthy",
		strings.ToLower(devs[2].UUID) + " Ready=False/XID48 XIDHealthy=False/XID48 action=ResetGPU",
	}
	if !slices.Equal(got, want) {
		t.Errorf("ListGpus:\n  %s\nwant every GPU, in index order, and no MIG instance:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	for _, name := range []string{strings.ToLower(devs[2].UUID), devs[2].UUID} {
		resp, err := c.GetGpu(ctx, &v1alpha1.GetGpuRequest{Name: name})
		if err != nil {
			t.Fatalf("GetGpu(%q): %v", name, err)
		}
		if got := summary(resp.GetGpu()); got != want[2] {
			t.Errorf("GetGpu(%q) = %s, want %s", name, got, want[2])
		}
	}
	for _, tc := range []struct {
		name string
		code codes.Code
	}{
		{"", codes.InvalidArgument},
		{"gpu-00000000-0000-0000-0000-000000000000", codes.NotFound},
		{devs[3].UUID, codes.NotFound}, // a MIG instance is no Gpu
	} {
		if _, err := c.GetGpu(ctx, &v1alpha1.GetGpuRequest{Name: tc.name}); status.Code(err) != tc.code {
			t.Errorf("GetGpu(%q): %v, want %v", tc.name, err, tc.code)
		}
	}
}

// TestWatchSendsEachChangeOnce: a watch starts with every GPU (ADDED), then gets one MODIFIED
// per change of a GPU, and nothing for signals that change no GPU.
func TestWatchSendsEachChangeOnce(t *testing.T) {
	devs := gpus(3, false)
	m := newMonitor(t, devs)
	path, _ := serveSocket(t, m, deviceapi.Options{}, &healthtest.Log{})
	w := watch(t, dial(t, path))
	n := func(i int) string { return strings.ToLower(devs[i].UUID) }
	for i := range devs {
		if got, want := next(t, w), "ADDED "+n(i)+" Ready=True/Healthy"; got != want {
			t.Fatalf("initial event %d: %s, want %s", i, got, want)
		}
	}
	steps := []struct {
		what string
		feed func()
		want string
	}{
		{"XID 48 on GPU 1", func() { m.Signal(health.XIDSignal(devs[1].UUID, 48, t0)) },
			"MODIFIED " + n(1) + " Ready=False/XID48 XIDHealthy=False/XID48 action=ResetGPU"},
		{"the same XID again, an application XID and a sample, which change nothing; then GPU 1's reset", func() {
			m.Signal(health.XIDSignal(devs[1].UUID, 48, t0.Add(time.Second)))
			m.Signal(health.XIDSignal(devs[2].UUID, 13, t0.Add(time.Second)))
			m.Signal(health.Signal{Kind: health.SignalSample, Device: devs[0].UUID, Time: t0.Add(time.Second)})
			m.Signal(health.Signal{Kind: health.SignalReset, Device: devs[1].UUID, Time: t0.Add(2 * time.Second)})
		}, "MODIFIED " + n(1) + " Ready=True/Healthy"},
		{"a lost GPU 0", func() {
			m.Signal(health.Signal{Kind: health.SignalLost, Device: devs[0].UUID, Time: t0.Add(3 * time.Second)})
		},
			"MODIFIED " + n(0) + " Ready=False/GPULost PresenceHealthy=False/GPULost action=RebootNode"},
	}
	for _, s := range steps {
		s.feed()
		if got := next(t, w); got != s.want {
			t.Fatalf("%s: got %s, want %s", s.what, got, s.want)
		}
	}
}

// TestWatchSendsAGPUThatARestoreAdds: a checkpoint restored into a running Monitor may bring a
// GPU the backend did not list (one lost with a sticky fault): watchers get it as ADDED.
func TestWatchSendsAGPUThatARestoreAdds(t *testing.T) {
	devs := gpus(2, false)
	before := newMonitor(t, devs)
	before.Signal(health.XIDSignal(devs[1].UUID, 79, t0))
	cp := before.Tracker().Checkpoint()

	m := newMonitor(t, devs[:1])
	path, _ := serveSocket(t, m, deviceapi.Options{}, &healthtest.Log{})
	w := watch(t, dial(t, path))
	next(t, w)
	if err := m.Restore(cp, cp.BootID, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, want := next(t, w), "ADDED "+strings.ToLower(devs[1].UUID)+" Ready=False/XID79 XIDHealthy=False/XID79 action=RebootNode"; got != want {
		t.Errorf("after the restore: %s, want %s", got, want)
	}
}

// TestSlowAndManyClientsSlowNobody: a client that stops reading is dropped with
// RESOURCE_EXHAUSTED once its buffer is full, while the Monitor's feed and a client that reads
// go on; watches beyond MaxWatchers are refused, and a dropped watcher's place comes back.
func TestSlowAndManyClientsSlowNobody(t *testing.T) {
	devs := gpus(2, false)
	uuid := devs[0].UUID
	m := newMonitor(t, devs)
	var log healthtest.Log
	path, _ := serveSocket(t, m, deviceapi.Options{MaxWatchers: 2, WatchBuffer: 8}, &log)
	good := watch(t, dial(t, path))
	// The slow client's windows stay at HTTP/2's 64 KiB (setting them turns off gRPC's dynamic
	// window), so that the server soon has to hold what it does not read.
	slowClient := dial(t, path, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	slow := watch(t, slowClient)
	for range devs {
		next(t, good)
		next(t, slow)
	}
	// More watches are refused while two are open (and logged once, not once each).
	for range 3 {
		if _, err := watch(t, dial(t, path)).Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a third watch with MaxWatchers 2: %v, want RESOURCE_EXHAUSTED", err)
		}
	}

	// Faults and repairs, each one awaited on the good watch, so that every one is a change the
	// server sends: far more than the slow client's windows and its buffer of 8 hold. They are
	// a day apart, so that no fault counts as one that came back after its repair (escalation).
	const toggles = 400
	for i := range toggles {
		at := t0.Add(time.Duration(i) * 25 * time.Hour)
		m.Signal(health.XIDSignal(uuid, 48, at))
		if got := next(t, good); !strings.Contains(got, "Ready=False/XID48") {
			t.Fatalf("toggle %d: the good watch got %s", i, got)
		}
		m.Signal(health.Signal{Kind: health.SignalReset, Device: uuid, Time: at.Add(time.Second / 2)})
		if got := next(t, good); !strings.Contains(got, "Ready=True/Healthy") {
			t.Fatalf("toggle %d: the good watch got %s", i, got)
		}
	}

	// The slow client reads what the server had sent before it gave up, then the error.
	received := 0
	var err error
	for {
		if _, err = slow.Recv(); err != nil {
			break
		}
		received++
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "list or watch again") {
		t.Fatalf("the slow watch ended with %v, want RESOURCE_EXHAUSTED", err)
	}
	if received >= 2*toggles {
		t.Errorf("the slow watch got all %d events: it was never dropped", received)
	}
	t.Logf("the slow watch got %d of %d events before it was dropped", received, 2*toggles)
	for _, what := range []string{"Refused Device API watches: too many open", "Dropped a Device API watcher that fell behind"} {
		if len(log.Containing(what)) != 1 {
			t.Errorf("the log does not say once %q:\n%s", what, log.String())
		}
	}
	// Its place is free again.
	w := watch(t, dial(t, path))
	for i := range devs {
		if got := next(t, w); !strings.HasPrefix(got, "ADDED ") {
			t.Fatalf("event %d of a new watch after the slow one was dropped: %s", i, got)
		}
	}
}

// TestStopEndsWatchesAndRemovesTheSocket: stopping ends every watch and removes the socket,
// and neither a client that never reads nor a connection that never speaks holds it up (they
// would for gRPC's handshake timeout of two minutes; the test's calls allow 30s).
func TestStopEndsWatchesAndRemovesTheSocket(t *testing.T) {
	devs := gpus(1, false)
	path, stop := serveSocket(t, newMonitor(t, devs), deviceapi.Options{}, &healthtest.Log{})
	w := watch(t, dial(t, path))
	next(t, w)
	if _, err := dial(t, path).WatchGpus(callContext(t), &v1alpha1.WatchGpusRequest{}); err != nil {
		t.Fatal(err)
	}
	mute, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	// The server accepts connections in order: once a later one is served, the mute one was
	// accepted, and its handshake is waiting.
	if _, err := dial(t, path).ListGpus(callContext(t), &v1alpha1.ListGpusRequest{}); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("ServeSocket: %v", err)
		}
	case <-time.After(callTimeout):
		t.Fatalf("the server did not stop within %v", callTimeout)
	}
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("a watch when the server stops: %v, want UNAVAILABLE", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is still there after the server stopped: %v", err)
	}
}

// TestEmbedderRegistersOnItsOwnServer: an embedder adds the service to a gRPC server of its own
// and runs the Server beside it; calls made before Run has the first snapshot wait for it, and
// calls after Run returned are refused.
func TestEmbedderRegistersOnItsOwnServer(t *testing.T) {
	devs := gpus(2, false)
	m := newMonitor(t, devs)
	srv := deviceapi.New(m, deviceapi.Options{})
	g := grpc.NewServer()
	srv.Register(g)
	path := filepath.Join(t.TempDir(), "embedder.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(lis) }()
	defer func() {
		g.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	c := dial(t, path)

	early, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.ListGpus(early, &v1alpha1.ListGpusRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("ListGpus before Run: %v, want it to wait (DEADLINE_EXCEEDED here)", err)
	}
	ctx, stopRun := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	defer func() {
		stopRun()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	list, err := c.ListGpus(callContext(t), &v1alpha1.ListGpusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.GetGpuList().GetItems()); n != len(devs) {
		t.Errorf("ListGpus: %d GPUs, want %d", n, len(devs))
	}
	// A watch ends when Run does: the embedder's gRPC server keeps serving the rest.
	w := watch(t, c)
	next(t, w)
	next(t, w)
	stopRun()
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("a watch after Run returned: %v, want UNAVAILABLE", err)
	}
	// What it would answer no longer follows the GPUs: calls are refused.
	if _, err := c.ListGpus(callContext(t), &v1alpha1.ListGpusRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("ListGpus after Run returned: %v, want UNAVAILABLE", err)
	}
}
