package agentcmd

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

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
