package extender

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	goruntime "runtime"
	runtimemetrics "runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// The shape of BenchmarkExtenderFilterWithSlowClients. A phase is slowCalls timed calls after
// a warm-up; the rounds alternate a phase without slow clients and one with them, so that the
// machine's drift (other processes on a shared machine) falls on both alike.
const (
	slowClients = 8
	// slowChunk every slowEvery is 800 KiB/s: a maximal body would take about 10 s, longer than
	// a phase, so every slow client holds its connection (and the server its buffer) the whole
	// phase.
	slowChunk  = 4 << 10
	slowEvery  = 5 * time.Millisecond
	slowRounds = 6
	slowCalls  = 400
	slowWarmup = 10
	// heapEvery is how often the heap in use is read during a phase.
	heapEvery = 2 * time.Millisecond
)

// BenchmarkExtenderFilterWithSlowClients is what slow clients cost the scheduler's calls. It
// serves the cluster of BenchmarkExtenderFilter as `gpuhealth extender --insecure` does (Run:
// informers over a fake clientset, the production body limit, read and write timeouts and
// concurrency bound; plain HTTP on 127.0.0.1), and a well-behaved client sends /filter calls
// (nodeCacheCapable, 5,000 names) one after another over one kept-alive connection, each timed
// from sending the request to reading the whole reply. The rounds alternate a phase without
// slow clients and one with slowClients clients that each announce a maximal body
// (DefaultMaxRequestBytes: the same /filter request, then white space) and trickle it,
// slowChunk every slowEvery, on a connection of their own, connecting again whenever the server
// answers or drops them. Each phase collects the garbage before its timed calls, so that both
// kinds start from the same heap.
//
// It reports the well-behaved p50 and p99 without (p50-ms, p99-ms) and with the slow clients
// (slow-p50-ms, slow-p99-ms), p99-ratio (with ÷ without); the Go heap of the whole process
// (server, fake API server and clients), live after that collection (live-heap-MiB,
// slow-live-heap-MiB) and at its peak in use over the timed calls, read every heapEvery
// (heap-MiB, slow-heap-MiB); and, per run of the rounds, the slow requests sent (slow-requests)
// and how many the server refused with 503 (slow-refused), answered with another error or closed
// before the body was whole (slow-cut), or answered in full (slow-answered).
func BenchmarkExtenderFilterWithSlowClients(b *testing.B) {
	nodes, pods := benchCluster(b)
	objs := make([]runtime.Object, 0, len(nodes)+len(pods))
	names := make([]string, len(nodes))
	for i, n := range nodes {
		objs = append(objs, n)
		names[i] = n.Name
	}
	for _, p := range pods {
		objs = append(objs, p)
	}
	body := filterArgs(b, names, nil)
	addr := serveExtender(b, fake.NewClientset(objs...))
	c := newFilterClient(addr, body)
	defer c.http.CloseIdleConnections()
	if err := c.check(b.Context()); err != nil {
		b.Fatal(err)
	}

	var alone, slow phaseResult
	var stats trickleStats
	for b.Loop() {
		for range slowRounds {
			alone.add(runPhase(b, c, nil))
			slow.add(runPhase(b, c, &trickler{addr: addr, prefix: body, size: DefaultMaxRequestBytes, stats: &stats}))
		}
	}
	b.StopTimer()
	p50, p99 := alone.percentiles()
	slowP50, slowP99 := slow.percentiles()
	mib := func(n uint64) float64 { return float64(n) / (1 << 20) }
	per := func(n *atomic.Int64) float64 { return float64(n.Load()) / float64(b.N) }
	b.ReportMetric(p50, "p50-ms")
	b.ReportMetric(p99, "p99-ms")
	b.ReportMetric(slowP50, "slow-p50-ms")
	b.ReportMetric(slowP99, "slow-p99-ms")
	b.ReportMetric(slowP99/p99, "p99-ratio")
	b.ReportMetric(mib(alone.liveHeap), "live-heap-MiB")
	b.ReportMetric(mib(slow.liveHeap), "slow-live-heap-MiB")
	b.ReportMetric(mib(alone.peakHeap), "heap-MiB")
	b.ReportMetric(mib(slow.peakHeap), "slow-heap-MiB")
	b.ReportMetric(per(&stats.requests), "slow-requests")
	b.ReportMetric(per(&stats.refused), "slow-refused")
	b.ReportMetric(per(&stats.cut), "slow-cut")
	b.ReportMetric(per(&stats.answered), "slow-answered")
}

// serveExtender runs Run on a loopback port until the benchmark ends and returns its address
// once it serves (Run serves only once its caches are filled).
func serveExtender(b *testing.B, client *fake.Clientset) string {
	b.Helper()
	// The benchmark cluster's malformed annotations would log a warning each.
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, ln, client, Options{}) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Run: %v", err)
		}
	})
	addr := ln.Addr().String()
	req, err := http.NewRequestWithContext(b.Context(), http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		b.Fatal(err)
	}
	// The connection waits in the listen backlog until Run serves.
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	resp, err := probe.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("/healthz answered %d", resp.StatusCode)
	}
	return addr
}

// filterClient is the well-behaved client: kube-scheduler's calls, one at a time, over one
// kept-alive connection.
type filterClient struct {
	http     *http.Client
	url      string
	body     []byte
	replyBuf bytes.Buffer
}

func newFilterClient(addr string, body []byte) *filterClient {
	return &filterClient{
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}},
		url:  "http://" + addr + "/filter", body: body,
	}
}

// call sends one /filter call and reads its reply into c.replyBuf; it returns how long that took.
func (c *filterClient) call(ctx context.Context) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(c.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	c.replyBuf.Reset()
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = c.replyBuf.ReadFrom(resp.Body)
	_ = resp.Body.Close()
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("/filter answered %d: %s", resp.StatusCode, c.replyBuf.Bytes())
	}
	return took, nil
}

// check makes one call and checks that every node was answered, as BenchmarkExtenderFilter does.
func (c *filterClient) check(ctx context.Context) error {
	if _, err := c.call(ctx); err != nil {
		return err
	}
	var res extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(c.replyBuf.Bytes(), &res); err != nil {
		return fmt.Errorf("reply: %w", err)
	}
	if res.Error != "" || res.NodeNames == nil {
		return fmt.Errorf("reply: error %q, node names %v", res.Error, res.NodeNames)
	}
	if got := len(*res.NodeNames) + len(res.FailedNodes); got != benchNodes {
		return fmt.Errorf("%d nodes answered, want %d", got, benchNodes)
	}
	return nil
}

// phaseResult gathers the calls' durations and the largest heaps of the phases of one kind.
type phaseResult struct {
	durations          []time.Duration
	liveHeap, peakHeap uint64
}

func (r *phaseResult) add(o phaseResult) {
	r.durations = append(r.durations, o.durations...)
	r.liveHeap = max(r.liveHeap, o.liveHeap)
	r.peakHeap = max(r.peakHeap, o.peakHeap)
}

// percentiles returns the p50 and p99 of the durations in milliseconds.
func (r *phaseResult) percentiles() (p50, p99 float64) {
	d := slices.Sorted(slices.Values(r.durations))
	pct := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e6 }
	return pct(0.50), pct(0.99)
}

// runPhase times slowCalls calls, with t's slow clients trickling meanwhile when t is not nil.
// The warm-up calls before them also wait until every slow client is sending its body; then
// the garbage is collected.
func runPhase(b *testing.B, c *filterClient, t *trickler) phaseResult {
	b.Helper()
	ctx, cancel := context.WithCancel(b.Context())
	var owned sync.WaitGroup
	defer func() {
		cancel()
		owned.Wait()
	}()
	if t != nil {
		owned.Go(func() { t.run(ctx) })
	}
	for i := 0; i < slowWarmup || (t != nil && t.sending.Load() < slowClients); i++ {
		if i > 100*slowWarmup {
			b.Fatalf("%d of %d slow clients sending after %d calls", t.sending.Load(), slowClients, i)
		}
		if _, err := c.call(ctx); err != nil {
			b.Fatal(err)
		}
	}
	goruntime.GC()
	r := phaseResult{durations: make([]time.Duration, 0, slowCalls), liveHeap: liveHeap()}
	peak := make(chan uint64, 1)
	owned.Go(func() { peak <- peakHeapInUse(ctx, heapEvery) })
	for range slowCalls {
		d, err := c.call(ctx)
		if err != nil {
			b.Fatal(err)
		}
		r.durations = append(r.durations, d)
	}
	cancel()
	r.peakHeap = <-peak
	return r
}

// liveHeap is the heap the last collection found live.
func liveHeap() uint64 {
	s := []runtimemetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	runtimemetrics.Read(s)
	return s[0].Value.Uint64()
}

// peakHeapInUse reads the Go heap in use (runtime.MemStats.HeapInuse: objects and the unused
// part of their spans) every every until ctx ends and returns the highest. runtime/metrics reads
// it without stopping the world, which runtime.ReadMemStats would, every time.
func peakHeapInUse(ctx context.Context, every time.Duration) uint64 {
	s := []runtimemetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}}
	read := func() uint64 {
		runtimemetrics.Read(s)
		return s[0].Value.Uint64() + s[1].Value.Uint64()
	}
	peak := read()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return max(peak, read())
		case <-tick.C:
			peak = max(peak, read())
		}
	}
}

// trickleStats counts the slow clients' requests and how each ended.
type trickleStats struct {
	requests, refused, cut, answered atomic.Int64
}

// trickler is slowClients slow clients: each sends a request that announces a body of size bytes
// (prefix, then spaces) and trickles it, slowChunk every slowEvery, connecting again once the
// server answered or dropped the request, until its context ends.
type trickler struct {
	addr   string
	prefix []byte
	size   int
	stats  *trickleStats
	// sending counts the clients that have sent the first part of a body.
	sending atomic.Int64
}

// run runs the clients until ctx ends and returns once they are all done.
func (t *trickler) run(ctx context.Context) {
	var clients sync.WaitGroup
	for range slowClients {
		clients.Go(func() {
			first := sync.OnceFunc(func() { t.sending.Add(1) })
			for ctx.Err() == nil {
				t.request(ctx, first)
			}
		})
	}
	clients.Wait()
}

// request sends one slow request and counts how it ended; one that ctx ended is not counted.
// sent is called after each part of the body written.
func (t *trickler) request(ctx context.Context, sent func()) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", t.addr)
	if err != nil {
		if ctx.Err() == nil {
			t.stats.cut.Add(1)
			pause(ctx, slowEvery)
		}
		return
	}
	t.stats.requests.Add(1)
	// status has what the server answered (0: it closed the connection without an answer); the
	// reader ends when the connection is closed, and request waits for it.
	status := make(chan int, 1)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			status <- 0
			return
		}
		_ = resp.Body.Close()
		status <- resp.StatusCode
	}()
	defer func() {
		_ = conn.Close()
		<-readerDone
	}()
	if _, err := fmt.Fprintf(conn, "POST /filter HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", t.addr, t.size); err != nil {
		t.dropped(ctx, status)
		return
	}
	spaces := bytes.Repeat([]byte{' '}, slowChunk)
	tick := time.NewTicker(slowEvery)
	defer tick.Stop()
	for off := 0; off < t.size; {
		select {
		case <-ctx.Done():
			return
		case code := <-status:
			t.stats.count(code)
			return
		case <-tick.C:
		}
		var chunk []byte
		if off < len(t.prefix) {
			chunk = t.prefix[off:min(off+slowChunk, len(t.prefix))]
		} else {
			chunk = spaces[:min(slowChunk, t.size-off)]
		}
		n, err := conn.Write(chunk)
		off += n
		if err != nil {
			t.dropped(ctx, status)
			return
		}
		sent()
	}
	select {
	case <-ctx.Done():
	case code := <-status:
		t.stats.count(code)
	}
}

// dropped counts a request whose connection failed a write: the server closed it, perhaps after
// an answer the reader is still reading.
func (t *trickler) dropped(ctx context.Context, status <-chan int) {
	wait := time.NewTimer(time.Second)
	defer wait.Stop()
	select {
	case <-ctx.Done():
	case code := <-status:
		t.stats.count(code)
	case <-wait.C:
		t.stats.count(0)
	}
}

// count counts a slow request the server answered with code (0: none).
func (s *trickleStats) count(code int) {
	switch code {
	case http.StatusOK:
		s.answered.Add(1)
	case http.StatusServiceUnavailable:
		s.refused.Add(1)
	default:
		s.cut.Add(1)
	}
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
