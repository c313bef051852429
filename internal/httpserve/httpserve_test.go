package httpserve_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/httpserve"
)

// notifyingListener closes closed when the server closes it, which Shutdown does first: from then
// on the server is draining.
type notifyingListener struct {
	net.Listener
	closed chan struct{}
	once   atomic.Bool
}

func (l *notifyingListener) Close() error {
	if l.once.CompareAndSwap(false, true) {
		close(l.closed)
	}
	return l.Listener.Close()
}

func listen(t *testing.T) *notifyingListener {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return &notifyingListener{Listener: lis, closed: make(chan struct{})}
}

// serve runs Serve in a goroutine the test waits for; done has its result.
func serve(t *testing.T, ctx context.Context, lis net.Listener, h http.Handler, opts ...httpserve.Option) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- httpserve.Serve(ctx, lis, h, opts...)
		close(done) // the cleanup below does not wait when the test took the result
	}()
	t.Cleanup(func() {
		select {
		case err, ok := <-done:
			if ok && err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return done
}

// get sends a GET in a goroutine; the returned channel has the body, or the error.
func get(t *testing.T, addr string) <-chan string {
	t.Helper()
	out := make(chan string, 1)
	go func() {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+addr, nil)
		if err != nil {
			out <- err.Error()
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- err.Error()
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			out <- err.Error()
			return
		}
		out <- string(body)
	}()
	return out
}

func TestServeAnswersUntilTheContextEnds(t *testing.T) {
	lis := listen(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := serve(t, ctx, lis, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	if body := <-get(t, lis.Addr().String()); body != "ok" {
		t.Errorf("body %q, want ok", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after the context ended: %v, want nil", err)
	}
}

type ctxKey struct{}

func TestServeDrainsRequestsInFlight(t *testing.T) {
	lis := listen(t)
	ctx, cancel := context.WithCancel(context.WithValue(t.Context(), ctxKey{}, "value"))
	started, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	var requestCtx atomic.Value // what the slow request's context says once released
	done := serve(t, ctx, lis, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		requestCtx.Store([2]any{r.Context().Err(), r.Context().Value(ctxKey{})})
		_, _ = w.Write([]byte("slow"))
		finished.Store(true)
	}))
	reply := get(t, lis.Addr().String())
	<-started
	cancel()
	<-lis.closed // Shutdown has begun
	select {
	case err := <-done:
		t.Fatalf("Serve returned (%v) while a request was in flight", err)
	case <-time.After(100 * time.Millisecond): // room for a wrong early return to show
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("Serve: %v, want nil after a clean drain", err)
	}
	if !finished.Load() {
		t.Error("Serve returned before the request in flight finished")
	}
	if body := <-reply; body != "slow" {
		t.Errorf("in-flight request got %q, want its answer", body)
	}
	if got := requestCtx.Load().([2]any); got[0] != nil || got[1] != "value" {
		t.Errorf("request context during the drain: err %v, value %v; want not canceled, carrying the serve context's values", got[0], got[1])
	}
}

func TestServeBoundsTheDrain(t *testing.T) {
	lis := listen(t)
	ctx, cancel := context.WithCancel(t.Context())
	started, stuck := make(chan struct{}), make(chan struct{})
	defer close(stuck)
	done := serve(t, ctx, lis, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(started)
		<-stuck
	}), httpserve.WithShutdownTimeout(10*time.Millisecond))
	reply := get(t, lis.Addr().String())
	<-started
	cancel()
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Serve with a request that outlives the shutdown timeout: %v, want context.DeadlineExceeded", err)
	}
	<-reply // the connection was closed
}

func TestServeReturnsListenerErrors(t *testing.T) {
	lis := listen(t)
	done := serve(t, t.Context(), lis, http.NotFoundHandler())
	_ = lis.Listener.Close()
	if err := <-done; err == nil {
		t.Error("Serve on a closed listener: nil, want the accept error")
	}
}
