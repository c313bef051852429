//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/agent/agenttest"
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
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
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
			NodeName: node, Client: client, Backend: backend, Policy: health.DefaultPolicy(), BootID: sim.New(&sim.Scenario{Node: node, GPUCount: 1}, sim.Options{}).BootID(),
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

	nodeWatch, err := c.Admin().CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	ids := watchValues(ctx, nodeWatch, func(ev watch.Event) (string, bool) {
		n, ok := ev.Object.(*corev1.Node)
		if !ok {
			return "", false
		}
		return n.Annotations[gpuhealthv1.UnhealthyIDsKey], true
	})
	ruleWatch, err := c.Admin().ResourceV1().DeviceTaintRules().Watch(ctx, metav1.ListOptions{LabelSelector: devicetaint.NodeLabel + "=" + node})
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
	var annLat, ruleLat, annRec, ruleRec []time.Duration
	at := time.Now()
	for i := range faults {
		gpu := i % len(uuids)
		rule := devicetaint.RuleName(uuids[gpu])
		at = at.Add(time.Second)
		start := time.Now()
		backend.Signals <- health.Signal{Kind: health.SignalXID, Device: uuids[gpu], XID: 48, Time: at}
		annLat = append(annLat, waitValue(t, ids, strconv.Itoa(gpu)).Sub(start))
		ruleLat = append(ruleLat, waitValue(t, ruleEvents, "ADDED "+rule).Sub(start))
		time.Sleep(changeSpacing)

		at = at.Add(time.Second)
		start = time.Now()
		backend.Signals <- health.Signal{Kind: health.SignalReset, Device: uuids[gpu], Time: at}
		annRec = append(annRec, waitValue(t, ids, "").Sub(start))
		ruleRec = append(ruleRec, waitValue(t, ruleEvents, "DELETED "+rule).Sub(start))
		time.Sleep(changeSpacing)
	}
	// The condition writer runs independently; give every writer a moment to settle, then count.
	time.Sleep(500 * time.Millisecond)
	writesAfter := gatherWrites(t, reg)
	changes := 2 * faults

	var b strings.Builder
	var figs []figure.Figure
	fmt.Fprintf(&b, "signal -> object visible through a watch, %d faults and %d recoveries, loopback, real kube-apiserver %s\n", faults, faults, controlplane.KubernetesVersion)
	fmt.Fprintf(&b, "| path | p50 | p99 | max |\n|---|---|---|---|\n")
	for _, row := range []struct {
		name string
		lat  []time.Duration
	}{
		{"fault -> volcano.sh/gpu-unhealthy-ids", annLat},
		{"fault -> DeviceTaintRule ADDED", ruleLat},
		{"recovery -> annotation removed", annRec},
		{"recovery -> DeviceTaintRule DELETED", ruleRec},
	} {
		slices.Sort(row.lat)
		p50, p99, maximum := percentile(row.lat, 0.5), percentile(row.lat, 0.99), row.lat[len(row.lat)-1]
		fmt.Fprintf(&b, "| %s | %v | %v | %v |\n", row.name, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), maximum.Round(10*time.Microsecond))
		figs = append(figs, figure.Figure{
			Name: figure.SignalToObject, Labels: map[string]string{figure.LabelPath: row.name}, Unit: figure.UnitMilliseconds,
			Value: milliseconds(p50), Samples: len(row.lat),
			Percentiles: map[string]float64{figure.P50: milliseconds(p50), figure.P99: milliseconds(p99), figure.Max: milliseconds(maximum)},
		})
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
