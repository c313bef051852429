package extender

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	"github.com/gpuhealth/gpuhealth/test/tlsfixture"
)

const filterBody = `{"pod":{"metadata":{"name":"p","namespace":"default"}},"nodenames":["n"]}`

// TestSchedulerCallsNeedAVerifiedClientCertificate: over HTTPS with a client CA, /filter,
// /prioritize and /bind answer only a client whose certificate that CA signed (kube-scheduler's
// tlsConfig); /healthz and /metrics answer anyone (probes, Prometheus); a certificate of another
// CA gets nothing.
func TestSchedulerCallsNeedAVerifiedClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, rogue := tlsfixture.NewCA(t, "scheduler-ca"), tlsfixture.NewCA(t, "rogue-ca")
	certFile, keyFile := ca.Server(t).Write(t, dir, "server")
	cfg, err := TLSConfig(certFile, keyFile, ca.Write(t, dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := started(t, Options{Bind: true, TLS: cfg}, node("n", 8, nil), pod("p", "", scheduling.ResourceGPU, 1, nil))
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.TLS = cfg
	srv.StartTLS()
	t.Cleanup(srv.Close)

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	client := func(p *tlsfixture.Pair) *http.Client {
		c := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if p != nil {
			pair, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
			if err != nil {
				t.Fatal(err)
			}
			c.Certificates = []tls.Certificate{pair}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: c}, Timeout: 10 * time.Second}
	}
	scheduler, other := ca.Client(t, "system:kube-scheduler"), rogue.Client(t, "anyone")
	call := func(c *http.Client, method, path string) (int, error) {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(filterBody)
		}
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, body)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	for _, path := range []string{"/filter", "/prioritize", "/bind"} {
		if code, err := call(client(nil), http.MethodPost, path); err != nil || code != http.StatusUnauthorized {
			t.Errorf("%s without a client certificate: %d %v, want 401", path, code, err)
		}
	}
	// Go's client sends no certificate the server's CA list does not name (the call is then
	// unauthenticated); another client may send it and fail the handshake. Neither gets in.
	if code, err := call(client(&other), http.MethodPost, "/filter"); err == nil && code != http.StatusUnauthorized {
		t.Errorf("a client certificate of another CA: %d, want refused", code)
	}
	if code, err := call(client(&scheduler), http.MethodPost, "/filter"); err != nil || code != http.StatusOK {
		t.Errorf("/filter from the scheduler: %d %v, want 200", code, err)
	}
	for _, path := range []string{"/healthz", "/metrics"} {
		if code, err := call(client(nil), http.MethodGet, path); err != nil || code != http.StatusOK {
			t.Errorf("%s without a client certificate: %d %v, want 200", path, code, err)
		}
	}
}

// TestConcurrentCallsAreCapped: a call over Options.MaxConcurrent is answered 503 at once, before
// its body is read, so slow clients trickling bodies hold at most that many.
func TestConcurrentCallsAreCapped(t *testing.T) {
	s, _ := started(t, Options{MaxConcurrent: 1}, node("n", 8, nil))
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	slowBody, slowWriter := io.Pipe()
	slowDone := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/filter", slowBody)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			slowDone <- 0
			return
		}
		resp.Body.Close()
		slowDone <- resp.StatusCode
	}()
	_, _ = slowWriter.Write([]byte(`{"pod":`)) // the slow client holds its slot, mid-body
	var code int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		resp, err := http.Post(srv.URL+"/filter", "application/json", strings.NewReader(filterBody))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if code = resp.StatusCode; code == http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
	}
	if code != http.StatusServiceUnavailable {
		t.Fatalf("a second call while one is in flight: %d, want 503", code)
	}
	_, _ = slowWriter.Write([]byte(`{"metadata":{"name":"p"}},"nodenames":["n"]}`))
	_ = slowWriter.Close()
	if got := <-slowDone; got != http.StatusOK {
		t.Errorf("the slow call ended %d, want 200", got)
	}
	resp, err := http.Post(srv.URL+"/filter", "application/json", strings.NewReader(filterBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a call after the slot was freed: %d, want 200", resp.StatusCode)
	}
}

// TestASlowBodyLosesItsSlot: a client that stops sending mid-body is cut off after BodyTimeout,
// and its call slot serves the next caller; before, it held the slot for the 30 s read timeout.
func TestASlowBodyLosesItsSlot(t *testing.T) {
	s, _ := started(t, Options{MaxConcurrent: 1, BodyTimeout: 300 * time.Millisecond}, node("n", 8, nil))
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	slowBody, slowWriter := io.Pipe()
	t.Cleanup(func() { _ = slowWriter.Close() })
	slowDone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/filter", slowBody)
		req.ContentLength = 8 << 20
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				err = fmt.Errorf("the stalled call was answered %d", resp.StatusCode)
			}
		}
		slowDone <- err
	}()
	_, _ = slowWriter.Write([]byte(`{"pod":`)) // and nothing more
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Post(srv.URL+"/filter", "application/json", strings.NewReader(filterBody))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stalled client kept the only slot: last answer %d", resp.StatusCode)
		}
	}
	if err := <-slowDone; err != nil && strings.Contains(err.Error(), "answered") {
		t.Error(err)
	}
}
