//go:build e2e

package fleet

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Counting the API requests and the writes the agents make.

// requestCounter counts the requests of every agent's client by kind ("PATCH nodes",
// "WATCH devicetaintrules", ...) through rest.Config.WrapTransport, the failed ones again by
// status ("failed 429"), the watches open now, and the bytes of the bodies sent and received
// (watch streams included; headers not).
type requestCounter struct {
	mu          sync.Mutex
	counts      map[string]int64
	openWatches atomic.Int64
	transports  atomic.Int64
	sent        atomic.Int64
	received    atomic.Int64
}

func newRequestCounter() *requestCounter { return &requestCounter{counts: map[string]int64{}} }

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	c.transports.Add(1) // one per client: every agent has its own connection
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		kind := requestKind(r)
		c.mu.Lock()
		c.counts[kind]++
		c.mu.Unlock()
		if r.ContentLength > 0 {
			c.sent.Add(r.ContentLength)
		}
		resp, err := rt.RoundTrip(r)
		if err == nil {
			resp.Body = &countedBody{ReadCloser: resp.Body, n: &c.received}
		}
		if failed := failure(resp, err); failed != "" {
			c.mu.Lock()
			c.counts["failed "+failed]++
			c.mu.Unlock()
		}
		if err == nil && strings.HasPrefix(kind, "WATCH ") {
			c.openWatches.Add(1)
			resp.Body = &watchBody{ReadCloser: resp.Body, closed: func() { c.openWatches.Add(-1) }}
		}
		return resp, err
	})
}

func (c *requestCounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

// bytes is the body bytes sent and received so far.
func (c *requestCounter) bytes() int64 { return c.sent.Load() + c.received.Load() }

// countedBody counts the bytes read from a response body.
type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// watchBody tells when a watch's response body is closed.
type watchBody struct {
	io.ReadCloser
	once   sync.Once
	closed func()
}

func (b *watchBody) Close() error {
	b.once.Do(b.closed)
	return b.ReadCloser.Close()
}

// failure names what went wrong with a request ("429", "409", "error"), or "" when nothing did.
// Failed requests are also counted by kind like the others, so a retry shows as a second
// request.
func failure(resp *http.Response, err error) string {
	switch {
	case err != nil:
		return "error"
	case resp.StatusCode >= 300:
		return strconv.Itoa(resp.StatusCode)
	}
	return ""
}

// requestKind names a request by verb and resource: GET on a collection is LIST, or WATCH with
// watch=true; a subresource is resource/subresource.
func requestKind(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:] // api, v1
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:] // apis, group, version
	default:
		return r.Method + " " + r.URL.Path
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	verb := r.Method
	if len(parts) == 0 {
		return verb + " /"
	}
	resource := parts[0]
	switch {
	case len(parts) == 1 && r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
		verb = "WATCH"
	case len(parts) == 1 && r.Method == http.MethodGet:
		verb = "LIST"
	case len(parts) >= 3:
		resource += "/" + parts[2]
	}
	return verb + " " + resource
}

// fleetWrites is the writes of every agent together (gpuhealth_api_writes_total), by reporter.
func fleetWrites(t *testing.T, fleet []*fleetNode) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, n := range fleet {
		for reporter, v := range nodeWrites(t, n) {
			out[reporter] += v
		}
	}
	return out
}

// nodeWrites is n's agent's writes (gpuhealth_api_writes_total), by reporter.
func nodeWrites(t *testing.T, n *fleetNode) map[string]int {
	t.Helper()
	out := map[string]int{}
	families, err := n.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "gpuhealth_api_writes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reporter" {
					out[l.GetValue()] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}

func sumWrites(w map[string]int) int {
	s := 0
	for _, v := range w {
		s += v
	}
	return s
}

func diff(after, before map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// total is the number of requests in m (the "failed ..." entries count them a second time).
func total(m map[string]int64) int64 {
	var s int64
	for k, v := range m {
		if !strings.HasPrefix(k, "failed ") {
			s += v
		}
	}
	return s
}

// kinds lists request counts by kind, most first.
func kinds(m map[string]int64) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			return int(m[b] - m[a])
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
