package agentcmd

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/nodegpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// While NVML is not available the agent serves not-ready and source_up 0, retries on its
// backoff, and returns what open returns once it works.
func TestWaitForDriverRetriesUntilOpen(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	notLoaded := &gpunvml.DriverError{Kind: gpunvml.ErrDriverNotLoaded}
	var mu sync.Mutex
	attempts := 0
	open := func() (string, error) {
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts < 3 {
			return "", notLoaded
		}
		return "backend", nil
	}
	addr := make(chan string, 1)
	type result struct {
		got string
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := waitForDriver(t.Context(), driverWait{node: "n1", metricsAddress: "127.0.0.1:0", clock: clk,
			initial: time.Second, max: 4 * time.Second, ready: func(a string) { addr <- a }}, open)
		done <- result{got, err}
	}()
	base := "http://" + <-addr
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "the NVIDIA kernel driver is not loaded") {
		t.Errorf("/readyz = %d %q, want 503 naming the reason", code, body)
	}
	if code, body := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d %q, want 200: the agent is alive", code, body)
	}
	if _, body := get(t, base+"/metrics"); !strings.Contains(body, `gpuhealth_source_up{node="n1",source="nvml"} 0`) {
		t.Errorf("/metrics lacks source_up nvml 0:\n%s", body)
	}
	for _, step := range []time.Duration{time.Second, 2 * time.Second} { // the backoff doubles
		for !clk.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		clk.Step(step - time.Nanosecond)
		select {
		case r := <-done:
			t.Fatalf("returned %v before the backoff of %v ended", r, step)
		case <-time.After(20 * time.Millisecond):
		}
		clk.Step(time.Nanosecond)
	}
	r := <-done
	if r.err != nil || r.got != "backend" || attempts != 3 {
		t.Errorf("waitForDriver = %q, %v after %d attempts; want the backend after 3", r.got, r.err, attempts)
	}
}

// Another error than a missing driver is returned at once: the agent exits with it.
func TestWaitForDriverOtherErrors(t *testing.T) {
	boom := errors.New("no permission")
	calls := 0
	_, err := waitForDriver(t.Context(), driverWait{node: "n1"}, func() (int, error) { calls++; return 0, boom })
	if !errors.Is(err, boom) || calls != 1 {
		t.Errorf("waitForDriver = %v after %d calls, want the error at once", err, calls)
	}
}

// A cancelled context (SIGTERM) ends the wait.
func TestWaitForDriverCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	clk := clocktesting.NewFakeClock(time.Now())
	done := make(chan error, 1)
	go func() {
		_, err := waitForDriver(ctx, driverWait{node: "n1", clock: clk}, func() (int, error) {
			return 0, &gpunvml.DriverError{Kind: gpunvml.ErrLibraryNotFound, Root: "/driver-root"}
		})
		done <- err
	}()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("waitForDriver = %v, want context.Canceled", err)
	}
}

// pausable is a Node whose labels the test sets, as the operator's managers do.
type pausable struct {
	mu     sync.Mutex
	labels map[string]string
	// unreadable makes the Node unreadable (an API server that does not answer yet).
	unreadable bool
	p          *nodegpu.OperatorPause
}

func newPausable(labels map[string]string) *pausable {
	n := &pausable{labels: labels}
	n.p = nodegpu.NewOperatorPause(func(context.Context) (*corev1.Node, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.unreadable {
			return nil, errors.New("the API server does not answer")
		}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: maps.Clone(n.labels)}}, nil
	})
	return n
}

func (n *pausable) setUnreadable(v bool) {
	n.mu.Lock()
	n.unreadable = v
	n.mu.Unlock()
	n.p.Notify()
}

// An agent that released NVML for the operator's pause does not open it again because its Node
// cannot be read: only a Node without the pause ends the wait.
func TestWaitForDriverAfterAPauseWaitsForTheNode(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	node := newPausable(map[string]string{})
	node.unreadable = true
	var opens atomic.Int32
	done := make(chan error, 1)
	go func() {
		_, err := waitForDriver(t.Context(), driverWait{node: "n1", clock: clk, initial: time.Second, max: 4 * time.Second, pause: node.p,
			away: &driverAway{Since: time.Now(), Reason: nodegpu.PausedReasonPrefix + " (nvidia.com/gpu.deploy.dcgm=paused-for-driver-upgrade)"}},
			func() (string, error) { opens.Add(1); return "backend", nil })
		done <- err
	}()
	clk.Step(time.Hour)
	select {
	case err := <-done:
		t.Fatalf("returned (%v) while the Node could not be read", err)
	case <-time.After(50 * time.Millisecond):
	}
	if n := opens.Load(); n != 0 {
		t.Fatalf("open called %d times while the Node could not be read", n)
	}
	node.setUnreadable(false)
	if err := <-done; err != nil || opens.Load() != 1 {
		t.Errorf("once the Node said no pause: %v with %d opens, want the backend after one", err, opens.Load())
	}
}

func (n *pausable) set(k, v string) {
	n.mu.Lock()
	n.labels[k] = v
	n.mu.Unlock()
	n.p.Notify()
}

// While the GPU operator pauses GPU clients the agent does not touch NVML (open is not called,
// however long it waits), says since when and why, and opens NVML as soon as the pause ends.
func TestWaitForDriverHoldsNVMLBackWhileTheOperatorPauses(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	node := newPausable(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade"})
	var opens atomic.Int32
	addr := make(chan string, 1)
	done := make(chan error, 1)
	since := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	go func() {
		_, err := waitForDriver(t.Context(), driverWait{node: "n1", metricsAddress: "127.0.0.1:0", clock: clk,
			initial: time.Second, max: 4 * time.Second, ready: func(a string) { addr <- a }, pause: node.p,
			away: &driverAway{Since: since, Reason: "asked"}},
			func() (string, error) { opens.Add(1); return "backend", nil })
		done <- err
	}()
	base := "http://" + <-addr
	code, body := get(t, base+"/readyz")
	for _, want := range []string{"NVML released since 2026-12-02T07:00:00Z", "nvidia.com/gpu.deploy.device-plugin=paused-for-driver-upgrade", "last known health"} {
		if code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
			t.Errorf("/readyz = %d %q, want 503 saying %q", code, body, want)
		}
	}
	clk.Step(time.Hour) // no backoff runs while paused
	node.set("nvidia.com/gpu.deploy.dcgm", "true")
	select {
	case err := <-done:
		t.Fatalf("returned (%v) while still paused", err)
	case <-time.After(50 * time.Millisecond):
	}
	if n := opens.Load(); n != 0 {
		t.Fatalf("open called %d times while the operator paused GPU clients", n)
	}
	node.set("nvidia.com/gpu.deploy.device-plugin", "true")
	if err := <-done; err != nil || opens.Load() != 1 {
		t.Errorf("after the pause waitForDriver = %v with %d opens, want the backend after one", err, opens.Load())
	}
}

// The record an earlier image of the agent left across its re-execution.
func TestDriverAwayRecord(t *testing.T) {
	a := driverAway{Since: time.Date(2026, 12, 2, 7, 0, 0, 5, time.UTC), Reason: "the GPU operator paused GPU clients (x=paused-for-driver-upgrade)"}
	got, err := parseDriverAway(a.encode())
	if err != nil || !got.Since.Equal(a.Since) || got.Reason != a.Reason {
		t.Errorf("parseDriverAway(encode) = %+v, %v; want %+v", got, err, a)
	}
	for _, bad := range []string{"", "yesterday because", "2026-13-01T00:00:00Z x"} {
		if _, err := parseDriverAway(bad); err == nil || !strings.Contains(err.Error(), DriverAwayEnv) {
			t.Errorf("parseDriverAway(%q) = %v, want an error naming %s", bad, err, DriverAwayEnv)
		}
	}
}
