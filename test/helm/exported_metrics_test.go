package helm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/scheduling/extender"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// The PromQL parser comes from github.com/prometheus/prometheus at v0.311.3 (Prometheus 3.11), the
// newest release whose requirements raise none of this module's (later ones pull newer grpc,
// client_golang, x/net, ... into the binaries' build list). Only this test imports it. promtool
// is a newer, separately pinned binary (hack/tools.sh); the expressions here use nothing either
// version lacks.

// TestMonitoringNamesOnlyExportedMetrics: every PromQL expression of the chart's alerts and of
// its dashboard parses, and every metric it selects is one that an agent, the scheduler
// extender or the breaker controller serves on its /metrics, scraped from them running.
func TestMonitoringNamesOnlyExportedMetrics(t *testing.T) {
	requireHelm(t)
	r := render(t, "prometheusRule.enabled=true", "grafanaDashboard.enabled=true")
	exprs := map[string]string{} // where -> expression
	for _, rule := range ruleList(t, r.object(t, ruleKind, ruleName)) {
		exprs["alert "+rule["alert"].(string)] = rule["expr"].(string)
	}
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", dashboardName, &cm)
	dash, err := dashboardExprs([]byte(cm.Data[dashboardKey]))
	if err != nil {
		t.Fatal(err)
	}
	for where, e := range dash {
		exprs["dashboard "+where] = e
	}

	served := exported{}
	for _, component := range []struct {
		name   string
		scrape func(*testing.T) string
	}{
		{"agent", scrapeAgent},
		{"agent validating a repaired GPU", scrapeValidatingAgent},
		{"extender", scrapeExtender},
		{"breaker controller", scrapeBreakerController},
	} {
		if err := served.add(component.scrape(t)); err != nil {
			t.Fatalf("%s: %v", component.name, err)
		}
	}
	served.addPrometheusSeries()

	for _, where := range slices.Sorted(maps.Keys(exprs)) {
		if err := served.check(exprs[where]); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
	t.Logf("checked %d expressions against %d metrics served", len(exprs), len(served))
}

// TestMetricCheckerCatchesMistakes proves the checker above fails where it should.
func TestMetricCheckerCatchesMistakes(t *testing.T) {
	served := exported{}
	if err := served.add(`# TYPE gpuhealth_gpu_health gauge
gpuhealth_gpu_health{node="n1"} 2
# TYPE gpuhealth_api_writes_total counter
gpuhealth_api_writes_total{reporter="annotation"} 3
# TYPE gpuhealth_signal_latency_seconds histogram
gpuhealth_signal_latency_seconds_bucket{le="+Inf"} 1
gpuhealth_signal_latency_seconds_sum 0.1
gpuhealth_signal_latency_seconds_count 1
`); err != nil {
		t.Fatal(err)
	}
	served.addPrometheusSeries()
	for _, tc := range []struct {
		name, expr, wantErr string
	}{
		{"served gauge", `count(gpuhealth_gpu_health == 2)`, ""},
		{"histogram series", `histogram_quantile(0.99, sum by (le) (rate(gpuhealth_signal_latency_seconds_bucket[5m])))`, ""},
		{"histogram count", `rate(gpuhealth_signal_latency_seconds_count[5m])`, ""},
		{"name as a matcher", `{__name__="gpuhealth_api_writes_total"}`, ""},
		{"Grafana variables", `sum(rate(gpuhealth_api_writes_total{node=~"$node"}[$__rate_interval]))`, ""},
		{"Prometheus' up", `up{job="gpuhealth-agent-metrics"} == 0`, ""},
		{"misspelt name", `count(gpuhealth_gpu_helth == 2)`, `"gpuhealth_gpu_helth" is not served`},
		{"one side of a binary expression not served", `gpuhealth_gpu_health * on (node) gpuhealth_gpu_evict`, `"gpuhealth_gpu_evict" is not served`},
		{"bucket of a counter", `rate(gpuhealth_api_writes_total_bucket[5m])`, `"gpuhealth_api_writes_total_bucket" is not served`},
		{"does not parse", `rate(gpuhealth_api_writes_total[5m]`, "parse"},
		{"name by regex", `{__name__=~"gpuhealth_.*"}`, "no literal metric name"},
		{"no expression", ``, "parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := served.check(tc.expr)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("check(%s) = %v, want nil", tc.expr, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("check(%s) = %v, want an error with %q", tc.expr, err, tc.wantErr)
			}
		})
	}
}

func TestDashboardExprsFindsEveryQuery(t *testing.T) {
	for _, tc := range []struct {
		name, json, wantErr string
		want                []string
	}{
		{
			name: "panels, rows and a variable",
			json: `{"panels":[{"type":"row","title":"r","panels":[{"type":"stat","title":"in row","targets":[{"expr":"a"}]}]},
				{"type":"timeseries","title":"t","targets":[{"expr":"b"},{"expr":"c"}]}],
				"templating":{"list":[{"name":"node","type":"query","query":{"query":"label_values(d, node)"}},{"name":"ds","type":"datasource","query":"prometheus"}]}}`,
			want: []string{"a", "b", "c", "d"},
		},
		{name: "a panel without a query", json: `{"panels":[{"type":"stat","title":"empty","targets":[{"expr":""}]}]}`, wantErr: `panel "empty" has no PromQL`},
		{name: "an unknown variable query", json: `{"panels":[],"templating":{"list":[{"name":"x","type":"query","query":"query_result(up)"}]}}`, wantErr: "variable x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := dashboardExprs([]byte(tc.json))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var exprs []string
			for _, e := range got {
				exprs = append(exprs, e)
			}
			slices.Sort(exprs)
			if !slices.Equal(exprs, tc.want) {
				t.Errorf("exprs = %v, want %v", exprs, tc.want)
			}
		})
	}
}

// exported maps the metric families components serve to their types.
type exported map[string]dto.MetricType

// add records the families of a /metrics answer in the text format.
func (e exported) add(text string) error {
	families, err := parseMetrics(text)
	if err != nil {
		return fmt.Errorf("parse /metrics: %w", err)
	}
	for name, f := range families {
		e[name] = f.GetType()
	}
	return nil
}

// addPrometheusSeries adds up, the series Prometheus itself writes for every target it scrapes
// (the agent-down alerts select it).
func (e exported) addPrometheusSeries() { e["up"] = dto.MetricType_GAUGE }

// grafanaDurations are Grafana's interval variables, which stand where PromQL wants a duration;
// any other $variable stands in a label matcher's value and becomes a match-all regex.
var (
	grafanaDurations = strings.NewReplacer("$__rate_interval", "5m", "${__rate_interval}", "5m", "$__interval", "1m", "${__interval}", "1m", "$__range", "1h", "${__range}", "1h")
	grafanaVariable  = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
)

// check parses expr (Grafana variables substituted) and returns an error unless every metric it
// selects is served: by name, or as the _bucket, _sum or _count series of a served histogram
// (_sum and _count of a summary).
func (e exported) check(expr string) error {
	expanded := grafanaVariable.ReplaceAllString(grafanaDurations.Replace(expr), ".*")
	ast, err := parser.NewParser(parser.Options{}).ParseExpr(expanded)
	if err != nil {
		return fmt.Errorf("parse %q: %w", expanded, err)
	}
	var errs []string
	parser.Inspect(ast, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		switch {
		case name == "":
			errs = append(errs, fmt.Sprintf("%s has no literal metric name", vs))
		case !e.serves(name):
			errs = append(errs, fmt.Sprintf("%q is not served by the agent, the extender or the breaker controller", name))
		}
		return nil
	})
	if len(errs) > 0 {
		return fmt.Errorf("%s: %s", expr, strings.Join(errs, "; "))
	}
	return nil
}

func (e exported) serves(name string) bool {
	if _, ok := e[name]; ok {
		return true
	}
	for suffix, types := range map[string][]dto.MetricType{
		"_bucket": {dto.MetricType_HISTOGRAM},
		"_sum":    {dto.MetricType_HISTOGRAM, dto.MetricType_SUMMARY},
		"_count":  {dto.MetricType_HISTOGRAM, dto.MetricType_SUMMARY},
	} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if t, ok := e[base]; ok && slices.Contains(types, t) {
				return true
			}
		}
	}
	return false
}

// labelValues is the one kind of query variable the dashboard uses: label_values(expr, label).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[A-Za-z_][A-Za-z0-9_]*\)$`)

// dashboardExprs returns every PromQL expression of a Grafana dashboard, by panel title or
// variable name: the targets of every panel (rows' nested panels included) and the expressions
// inside label_values() variables. A panel with no PromQL, or a query variable of another form,
// is an error, so that nothing goes unchecked.
func dashboardExprs(data []byte) (map[string]string, error) {
	var dash struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	out := map[string]string{}
	var walk func([]panel) error
	walk = func(panels []panel) error {
		for _, p := range panels {
			if p.Type == "row" {
				if err := walk(p.Panels); err != nil {
					return err
				}
				continue
			}
			n := 0
			for i, t := range p.Targets {
				if t.Expr != "" {
					out[fmt.Sprintf("panel %q target %d", p.Title, i)] = t.Expr
					n++
				}
			}
			if n == 0 {
				return fmt.Errorf("panel %q has no PromQL", p.Title)
			}
		}
		return nil
	}
	if err := walk(dash.Panels); err != nil {
		return nil, err
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		var wrapped struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &wrapped); err != nil {
				return nil, fmt.Errorf("variable %s: query is neither a string nor {query}", v.Name)
			}
			q = wrapped.Query
		}
		m := labelValues.FindStringSubmatch(strings.TrimSpace(q))
		if m == nil {
			return nil, fmt.Errorf("variable %s: %q is not label_values(expr, label)", v.Name, q)
		}
		out["variable "+v.Name] = m[1]
	}
	return out, nil
}

type panel struct {
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// faultyGPU is an agent backend with one GPU that loses its event stream and reports XID 79
// (fallen off the bus: Unhealthy, evict), so that every per-GPU series the agent has is served.
type faultyGPU struct{ gpu health.Device }

func (b faultyGPU) Devices() []health.Device { return []health.Device{b.gpu} }

func (b faultyGPU) Run(ctx context.Context, sink gpu.Sink) error {
	sink.SetUnmonitored(b.gpu.UUID, true)
	sink.Signal(health.XIDSignal(b.gpu.UUID, 79, time.Now()))
	<-ctx.Done()
	return nil
}

// scrapeAgent runs an agent (every reporter, the circuit breaker on) against a fake API server
// and returns its /metrics once it has evaluated the fault and its reporters have synced.
func scrapeAgent(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logr.Discard()))
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	var addr atomic.Value
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return agent.Run(gctx, agent.Options{
			NodeName: "n1", Client: adapt.Clientset(client), Policy: health.DefaultPolicy(), BootID: "boot-1",
			Backend:        faultyGPU{health.Device{UUID: "GPU-a", Index: 0, Model: "H100"}},
			Agent:          config.AgentConfig{CheckpointPath: "-", CircuitBreaker: config.CircuitBreakerConfig{Enabled: true}},
			MetricsAddress: "127.0.0.1:0",
			Ready:          func(a string) { addr.Store(a) },
		})
	})
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	var text string
	err := wait.PollUntilContextTimeout(gctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		a, _ := addr.Load().(string)
		if a == "" {
			return false, nil
		}
		body, err := get(ctx, "http://"+a+"/metrics")
		if err != nil {
			return false, nil //nolint:nilerr // not serving yet
		}
		text = body
		return agentCaughtUp(body), nil
	})
	if err != nil {
		t.Fatalf("the agent did not serve the fault and a sync: %v\n%s", err, text)
	}
	return text
}

// scrapeValidatingAgent runs an agent with remediation and validation on, on a simulated GPU
// whose XID 48 a reset clears and whose diagnostic fails, and returns its /metrics once a
// validation has been judged: the validation series exist only from a verdict on.
func scrapeValidatingAgent(t *testing.T) string {
	t.Helper()
	sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n1\ngpus: {count: 1}\n" +
		"events:\n  - {at: 0s, gpu: 0, diag: fail}\n  - {at: 0s, gpu: 0, xid: 48}\n"))
	if err != nil {
		t.Fatal(err)
	}
	backend := sim.New(sc, sim.Options{Clock: clock.RealClock{}, SampleInterval: 100 * time.Millisecond, Forever: true})
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logr.Discard()))
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	var addr atomic.Value
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return agent.Run(gctx, agent.Options{
			NodeName: "n1", Client: adapt.Clientset(client), Policy: health.DefaultPolicy(), BootID: backend.BootID(),
			Backend:        backend,
			Agent:          config.AgentConfig{CheckpointPath: "-"},
			MetricsAddress: "127.0.0.1:0",
			Ready:          func(a string) { addr.Store(a) },
			Remediation: agent.RemediationOptions{
				Config: config.RemediationConfig{Enabled: true, PodResourcesSocket: "-", Namespace: testNamespace,
					Validation: config.ValidationConfig{Enabled: true}},
				Resetter: backend, Diagnoser: backend, Poll: 100 * time.Millisecond,
			},
		})
	})
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	var text string
	err = wait.PollUntilContextTimeout(gctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		a, _ := addr.Load().(string)
		if a == "" {
			return false, nil
		}
		body, err := get(ctx, "http://"+a+"/metrics")
		if err != nil {
			return false, nil //nolint:nilerr // not serving yet
		}
		text = body
		families, err := parseMetrics(body)
		if err != nil {
			return false, nil //nolint:nilerr // a scrape cut short
		}
		_, judged := families["gpuhealth_validation_runs_total"]
		return judged, nil
	})
	if err != nil {
		t.Fatalf("the agent did not judge a validation: %v\n%s", err, text)
	}
	return text
}

// scrapeExtender starts the extender on a fake API server and returns its /metrics after one
// /filter call.
func scrapeExtender(t *testing.T) string {
	t.Helper()
	s := extender.New(fake.NewClientset(), extender.Options{})
	if err := s.Start(klog.NewContext(t.Context(), logr.Discard())); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/filter", "application/json", strings.NewReader(`{"Pod":{"metadata":{"name":"p"}},"NodeNames":["n1"]}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	body, err := get(t.Context(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// scrapeBreakerController serves the breaker controller's registry, built as the command builds
// it, and returns its /metrics.
func scrapeBreakerController(t *testing.T) string {
	t.Helper()
	m := breaker.NewControllerMetrics()
	srv := httptest.NewServer(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	body, err := get(t.Context(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func get(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
}

// agentCaughtUp says whether an agent's /metrics shows the fault evaluated (a GPU Unhealthy)
// and a reporter's sync.
func agentCaughtUp(text string) bool {
	families, err := parseMetrics(text)
	if err != nil {
		return false
	}
	unhealthy := slices.ContainsFunc(families["gpuhealth_gpu_health"].GetMetric(), func(m *dto.Metric) bool {
		return m.GetGauge().GetValue() == float64(health.Unhealthy)
	})
	synced := slices.ContainsFunc(families["gpuhealth_api_sync_duration_seconds"].GetMetric(), func(m *dto.Metric) bool {
		return m.GetHistogram().GetSampleCount() > 0
	})
	return unhealthy && synced
}

func parseMetrics(text string) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(text))
}
