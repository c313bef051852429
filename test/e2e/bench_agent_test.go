//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/agent/agenttest"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// seen is one observation of a watched object: when, and the value the benchmark waits for.
type seen struct {
	at    time.Time
	value string
}

// watchValues forwards, for every event of w, the receive time and value(obj).
func watchValues(ctx context.Context, w watch.Interface, value func(watch.Event) (string, bool)) <-chan seen {
	out := make(chan seen, 1024)
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				if v, ok := value(ev); ok {
					out <- seen{at: time.Now(), value: v}
				}
			}
		}
	}()
	return out
}

func waitValue(t *testing.T, ch <-chan seen, want string) time.Time {
	t.Helper()
	timeout := time.After(pollTimeout)
	for {
		select {
		case s := <-ch:
			if s.value == want {
				return s.at
			}
		case <-timeout:
			t.Fatalf("never saw %q", want)
		}
	}
}

// changeSpacing keeps state changes apart, as they are in life, so that each is measured on its
// own rather than queued behind the previous one's requests in the client's rate limiter
// (agent.ClientQPS; a change costs about six requests).
const changeSpacing = 250 * time.Millisecond

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

// TestBenchSignalToObject measures, on the real control plane, how long a GPU fault takes from
// the signal to the objects schedulers read (the Volcano annotation and the DeviceTaintRule, as
// seen through watches), over at least 200 faults and their recoveries, and how many API writes
// each state change costs per sink. It asserts only counts, never times: the figures are printed
// as tables, and written as JSON lines (package figure) to GPUHEALTH_BENCH_OUT, from which
// hack/bench renders docs/benchmarks.md (`make bench`, `make bench-e2e`). The agent's client has
// the same rate limits as `gpuhealth agent`.
func TestBenchSignalToObject(t *testing.T) {
	faults := 50 // make bench-e2e asks for 200
	if v := os.Getenv("GPUHEALTH_BENCH_FAULTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GPUHEALTH_BENCH_FAULTS=%q: want a positive number", v)
		}
		faults = n
	}
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	const node = "bench-node"
	uuids := gpuNode(t, c, node, 8)
	agentKubeconfig(t, c) // creates the least-privilege ServiceAccount, role and binding
	cfg, err := c.ServiceAccountConfig(ctx, agentNamespace, "gpuhealth-agent")
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = agent.ClientQPS, agent.ClientBurst // as `gpuhealth agent` runs
	// The bare client: the same identity, rate limits and spacing, no agent logic. What it
	// measures is the limit the agent is compared with.
	bare, err := kubernetes.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	trace := &requestTrace{}
	cfg.Wrap(trace.wrap)
	client, err := kube.NewForConfig(cfg) // the agent's own client
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateReadyNode(ctx, bareNode, nil); err != nil {
		t.Fatal(err)
	}

	reporters := benchReporters()
	if reporters == nil {
		reporters = config.AllReporters()
	}
	backend := &agenttest.Backend{Signals: make(chan health.Signal)}
	for i, u := range uuids {
		backend.GPUs = append(backend.GPUs, health.Device{UUID: u, Index: i, Model: "bench"})
	}
	reg := prometheus.NewRegistry()
	agentCtx, stopAgent := context.WithCancel(ctx)
	agentDone := make(chan error, 1)
	go func() {
		agentDone <- agent.Run(agentCtx, agent.Options{
			NodeName: node, Client: client, Backend: backend, Policy: cyclingPolicy(), BootID: sim.New(&sim.Scenario{Node: node, GPUCount: 1}, sim.Options{}).BootID(),
			Agent:    config.AgentConfig{CheckpointPath: "-", Resync: ptrDuration(time.Hour), Reporters: reporters},
			Registry: reg,
		})
	}()
	defer func() {
		stopAgent()
		if err := <-agentDone; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()

	// One watch of each kind sees the agent's objects and the bare client's, so both are timed
	// the same way; the values carry the object's name.
	nodeWatch, err := c.Admin().CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids := watchValues(ctx, nodeWatch, func(ev watch.Event) (string, bool) {
		n, ok := ev.Object.(*corev1.Node)
		if !ok {
			return "", false
		}
		return n.Name + "=" + n.Annotations[gpuhealthv1.UnhealthyIDsKey], true
	})
	ruleWatch, err := c.Admin().ResourceV1().DeviceTaintRules().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ruleEvents := watchValues(ctx, ruleWatch, func(ev watch.Event) (string, bool) {
		r, ok := ev.Object.(*resourcev1.DeviceTaintRule)
		if !ok {
			return "", false
		}
		return string(ev.Type) + " " + r.Name, true
	})
	// The start-up reconcile writes the gpu-health annotation and the condition once; wait for it.
	eventually(t, "start-up reconcile", func(context.Context) (bool, string, error) {
		w := gatherWrites(t, reg)
		return w["annotation"] == 1 && (w["condition"] == 1 || !slices.Contains(reporters, "condition")), fmt.Sprint(w), nil
	})
	writesBefore := gatherWrites(t, reg)
	paths := []string{pathFaultAnnotation, pathFaultRule, pathRecoveryAnnotation, pathRecoveryRule}
	agentLat, bareLat := map[string][]time.Duration{}, map[string][]time.Duration{}
	stages := map[string]map[string][]time.Duration{} // path → stage → durations
	record := func(path string, start, seenAt time.Time, req tracedRequest, ok bool) {
		agentLat[path] = append(agentLat[path], seenAt.Sub(start))
		if !ok {
			t.Errorf("%s: no request of the agent's in the trace", path)
			return
		}
		if stages[path] == nil {
			stages[path] = map[string][]time.Duration{}
		}
		stages[path][stageInAgent] = append(stages[path][stageInAgent], req.start.Sub(start))
		stages[path][stageRequest] = append(stages[path][stageRequest], req.end.Sub(req.start))
		stages[path][stageWatch] = append(stages[path][stageWatch], seenAt.Sub(req.end))
	}
	var bareRule *resourcev1.DeviceTaintRule
	at := time.Now()
	for i := range faults {
		gpu := i % len(uuids)
		rule := devicetaint.RuleName(node, uuids[gpu])
		at = at.Add(time.Second)
		trace.reset()
		start := time.Now()
		backend.Signals <- health.Signal{Kind: health.SignalXID, Device: uuids[gpu], XID: 48, Time: at}
		annSeen := waitValue(t, ids, node+"="+strconv.Itoa(gpu))
		ruleSeen := waitValue(t, ruleEvents, "ADDED "+rule)
		req, ok := trace.first(http.MethodPatch, "/nodes/"+node)
		record(pathFaultAnnotation, start, annSeen, req, ok)
		req, ok = trace.first(http.MethodPost, "/devicetaintrules")
		record(pathFaultRule, start, ruleSeen, req, ok)
		faulted := getNode(t, c, node)
		if bareRule == nil { // the bare client creates rules of the same shape
			got, err := c.Admin().ResourceV1().DeviceTaintRules().Get(ctx, rule, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			bareRule = &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "bench-bare", Labels: map[string]string{devicetaint.NodeLabel: bareNode}}, Spec: got.Spec}
		}
		time.Sleep(changeSpacing)

		at = at.Add(time.Second)
		trace.reset()
		start = time.Now()
		backend.Signals <- health.Signal{Kind: health.SignalReset, Device: uuids[gpu], Time: at}
		annSeen = waitValue(t, ids, node+"=")
		ruleSeen = waitValue(t, ruleEvents, "DELETED "+rule)
		req, ok = trace.first(http.MethodPatch, "/nodes/"+node)
		record(pathRecoveryAnnotation, start, annSeen, req, ok)
		req, ok = trace.first(http.MethodDelete, "/devicetaintrules/"+rule)
		record(pathRecoveryRule, start, ruleSeen, req, ok)
		recovered := getNode(t, c, node)
		time.Sleep(changeSpacing)

		// The same two changes by the bare client, interleaved so that both see the same
		// API server in the same state: one merge PATCH of the annotations the agent wrote, on a
		// Node that carries the same ones, and one create (or delete) of a rule of the same
		// shape, sent together as the agent sends them.
		ann, created := bareChange(ctx, t, bare, ids, ruleEvents, faulted, strconv.Itoa(gpu), bareRule)
		bareLat[pathFaultAnnotation] = append(bareLat[pathFaultAnnotation], ann)
		bareLat[pathFaultRule] = append(bareLat[pathFaultRule], created)
		time.Sleep(changeSpacing)
		ann, deleted := bareChange(ctx, t, bare, ids, ruleEvents, recovered, "", bareRule)
		bareLat[pathRecoveryAnnotation] = append(bareLat[pathRecoveryAnnotation], ann)
		bareLat[pathRecoveryRule] = append(bareLat[pathRecoveryRule], deleted)
		time.Sleep(changeSpacing)
	}
	// The condition writer runs independently; give every writer a moment to settle, then count.
	time.Sleep(500 * time.Millisecond)
	writesAfter := gatherWrites(t, reg)
	changes := 2 * faults

	var b strings.Builder
	var figs []figure.Figure
	fmt.Fprintf(&b, "signal -> object visible through a watch, %d faults and %d recoveries, loopback, real kube-apiserver %s\n", faults, faults, controlplane.KubernetesVersion)
	fmt.Fprintf(&b, "| path | agent p50 | p99 | max | bare client p50 | p99 | ratio p50 | p99 |\n|---|---|---|---|---|---|---|---|\n")
	for _, path := range paths {
		a, bc := latencyFigure(figure.SignalToObject, path, agentLat[path]), latencyFigure(figure.BareClientToObject, path, bareLat[path])
		fmt.Fprintf(&b, "| %s | %.2fms | %.2fms | %.2fms | %.2fms | %.2fms | %.2f× | %.2f× |\n", path,
			a.Percentiles[figure.P50], a.Percentiles[figure.P99], a.Percentiles[figure.Max], bc.Percentiles[figure.P50], bc.Percentiles[figure.P99],
			a.Percentiles[figure.P50]/bc.Percentiles[figure.P50], a.Percentiles[figure.P99]/bc.Percentiles[figure.P99])
		figs = append(figs, a, bc)
	}
	fmt.Fprintf(&b, "\nwhere the agent's time goes (p50 of each stage)\n| path | signal -> request sent | request -> response | response -> watch |\n|---|---|---|---|\n")
	for _, path := range paths {
		fmt.Fprintf(&b, "| %s |", path)
		for _, stage := range []string{stageInAgent, stageRequest, stageWatch} {
			f := latencyFigure(figure.SignalTrace, path, stages[path][stage])
			f.Labels[figure.LabelStage] = stage
			fmt.Fprintf(&b, " %.2fms |", f.Percentiles[figure.P50])
			figs = append(figs, f)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "\n| sink | writes | state changes | writes per change |\n|---|---|---|---|\n")
	for _, sink := range reporters {
		w := writesAfter[sink] - writesBefore[sink]
		fmt.Fprintf(&b, "| %s | %d | %d | %.2f |\n", sink, w, changes, float64(w)/float64(changes))
		figs = append(figs, figure.Figure{
			Name: figure.WritesPerChange, Labels: map[string]string{figure.LabelSink: sink}, Unit: figure.UnitWritesPerChange,
			Value: float64(w) / float64(changes), Samples: changes,
		})
		if (sink == "annotation" || sink == "devicetaint") && w != changes { // condition coalesces flips; claimstatus writes only for claims
			t.Errorf("%s: %d writes for %d state changes, want exactly one each", sink, w, changes)
		}
	}
	fmt.Println(b.String())
	// hack/bench reads the figures as JSON lines; the table above is for people.
	if path := os.Getenv("GPUHEALTH_BENCH_OUT"); path != "" {
		if err := figure.WriteFile(path, figs...); err != nil {
			t.Error(err)
		}
	}
}

func milliseconds(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ptrDuration(d time.Duration) *config.Duration {
	v := config.Duration(d)
	return &v
}

func gatherWrites(t *testing.T, reg *prometheus.Registry) map[string]int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, f := range families {
		if f.GetName() != "gpuhealth_api_writes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reporter" {
					out[l.GetValue()] = int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}

func benchReporters() []string {
	if v := os.Getenv("GPUHEALTH_BENCH_REPORTERS"); v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

// The paths TestBenchSignalToObject times, and the stages of the agent's trace.
const (
	pathFaultAnnotation    = "fault -> volcano.sh/gpu-unhealthy-ids"
	pathFaultRule          = "fault -> DeviceTaintRule ADDED"
	pathRecoveryAnnotation = "recovery -> annotation removed"
	pathRecoveryRule       = "recovery -> DeviceTaintRule DELETED"

	stageInAgent = "signal -> request sent"
	stageRequest = "request -> response"
	stageWatch   = "response -> watch"

	// bareNode is the Node whose annotation the bare client patches.
	bareNode = "bench-bare-node"
)

// tracedRequest is one request of the agent's client: when it left and when its response came.
type tracedRequest struct {
	method, path string
	start, end   time.Time
}

// requestTrace records every request of a client (rest.Config.Wrap), so that the time from a
// signal to an object can be split at the request that wrote it.
type requestTrace struct {
	mu       sync.Mutex
	requests []tracedRequest
}

func (r *requestTrace) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		start := time.Now()
		resp, err := next.RoundTrip(req)
		end := time.Now()
		r.mu.Lock()
		r.requests = append(r.requests, tracedRequest{method: req.Method, path: req.URL.Path, start: start, end: end})
		r.mu.Unlock()
		return resp, err
	})
}

func (r *requestTrace) reset() {
	r.mu.Lock()
	r.requests = r.requests[:0]
	r.mu.Unlock()
}

// first returns the earliest request since the last reset with this method and a path ending in
// suffix. A watch can see an object before its writer has read the response, so it waits a
// moment for the request to complete.
func (r *requestTrace) first(method, suffix string) (tracedRequest, bool) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		if req, ok := r.find(method, suffix); ok || time.Now().After(deadline) {
			return req, ok
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *requestTrace) find(method, suffix string) (tracedRequest, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var found tracedRequest
	ok := false
	for _, req := range r.requests {
		if req.method == method && strings.HasSuffix(req.path, suffix) && (!ok || req.start.Before(found.start)) {
			found, ok = req, true
		}
	}
	return found, ok
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// bareChange makes, with a bare client, the two changes a GPU state change makes: a merge PATCH
// on bareNode of the annotations the agent has just written on its Node (the Volcano list, the
// gpu-health summaries and the list's state, each with the agent's value, or removed where the
// agent's Node has none), so that both Nodes carry the same annotations and every patch the same
// bytes, and a create (value set) or delete of rule, sent together. value is the Volcano list's
// value the watch waits for. It returns the time until the watches saw each.
func bareChange(ctx context.Context, t *testing.T, client kubernetes.Interface, ids, rules <-chan seen, agentNode *corev1.Node, value string, rule *resourcev1.DeviceTaintRule) (annotation, ruleSeen time.Duration) {
	t.Helper()
	copied := map[string]any{}
	for _, key := range []string{gpuhealthv1.UnhealthyIDsKey, gpuhealthv1.HealthKey, gpuhealthv1.VolcanoStateKey} {
		if v, ok := agentNode.Annotations[key]; ok {
			copied[key] = v
		} else {
			copied[key] = nil
		}
	}
	if copied[gpuhealthv1.UnhealthyIDsKey] != nil && copied[gpuhealthv1.UnhealthyIDsKey] != value {
		t.Fatalf("the agent's Node has %s=%v, want %q", gpuhealthv1.UnhealthyIDsKey, copied[gpuhealthv1.UnhealthyIDsKey], value)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": copied}})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	start := time.Now()
	go func() {
		_, err := client.CoreV1().Nodes().Patch(ctx, bareNode, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "bench-bare"})
		errs <- err
	}()
	go func() {
		var err error
		if value != "" {
			_, err = client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{FieldManager: "bench-bare"})
		} else {
			err = client.ResourceV1().DeviceTaintRules().Delete(ctx, rule.Name, metav1.DeleteOptions{})
		}
		errs <- err
	}()
	want := "ADDED " + rule.Name
	if value == "" {
		want = "DELETED " + rule.Name
	}
	annotation = waitValue(t, ids, bareNode+"="+value).Sub(start)
	ruleSeen = waitValue(t, rules, want).Sub(start)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("bare client: %v", err)
		}
	}
	return annotation, ruleSeen
}

// getNode reads the Node name as the API server has it now.
func getNode(t *testing.T, c *controlplane.Cluster, name string) *corev1.Node {
	t.Helper()
	n, err := c.Admin().CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// latencyFigure summarises durations as a figure in milliseconds: the p50, with P50, P99 and Max.
func latencyFigure(name, path string, lat []time.Duration) figure.Figure {
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	f := figure.Figure{Name: name, Labels: map[string]string{figure.LabelPath: path}, Unit: figure.UnitMilliseconds, Samples: len(sorted)}
	if len(sorted) == 0 {
		return f
	}
	p50, p99, maximum := percentile(sorted, 0.5), percentile(sorted, 0.99), sorted[len(sorted)-1]
	f.Value = milliseconds(p50)
	f.Percentiles = map[string]float64{figure.P50: milliseconds(p50), figure.P99: milliseconds(p99), figure.Max: milliseconds(maximum)}
	return f
}

// cyclingPolicy is the default policy without escalation: the benchmark faults and resets the
// same GPUs hundreds of times to time the paths, which to a GPU's history is a fault that keeps
// returning after every repair (ReplaceGPU, which no reset clears).
func cyclingPolicy() *health.Policy {
	p := health.DefaultPolicy()
	p.Escalation.Enabled = false
	return p
}
