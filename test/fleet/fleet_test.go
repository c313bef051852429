//go:build e2e

package fleet

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/agent/agenttest"
	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

const (
	gpusPerNode    = 8
	agentNamespace = "gpuhealth-system"
	agentAccount   = "gpuhealth-agent"
	// waveXID is the fault of the wave: a double-bit ECC error makes a GPU Unhealthy (NoSchedule).
	waveXID = 48
	// waveEvery: one GPU in waveEvery fails in the wave (10%).
	waveEvery = 10
	// convergeLimit bounds how long the test waits for start-up and for the wave: a hang is a
	// failure, but the figures themselves are never asserted.
	convergeLimit = 5 * time.Minute
)

// Figures are what one fleet run measured; GPUHEALTH_FLEET_OUT receives them as JSON lines
// (Figures.figures), from which hack/bench renders docs/benchmarks.md.
type Figures struct {
	Nodes     int
	GPUs      int
	Reporters []string
	// FlowControl says whether the agents had the chart's FlowSchema and priority level.
	FlowControl bool
	// Breaker says whether the agents ran the circuit breaker (GPUHEALTH_FLEET_BREAKER_FRACTION
	// of the GPUs, default 20%, above the wave), and BreakerBudget its budget in GPUs.
	Breaker       bool
	BreakerBudget int
	// When the budget is below the wave: the most rules ever seen with a disruptive effect at
	// once (never above the budget), and the seconds until exactly the budget had one.
	BreakerMaxDisruptive int
	BreakerSettleSeconds float64

	// SetupSeconds is creating the Nodes and ResourceSlices (not part of the agent's cost).
	SetupSeconds float64
	// StartupSeconds is from starting every agent at once until every agent's /readyz is ok (every
	// reporter has done its start-up reconcile).
	StartupSeconds  float64
	StartupRequests int64
	StartupByKind   map[string]int64

	// Per node: Go heap in use and process RSS added by the agents, and their goroutines.
	HeapPerNodeKiB    float64
	RSSPerNodeKiB     float64
	GoroutinesPerNode float64

	// Steady state: nothing changes for SteadySeconds after start-up.
	SteadySeconds    float64
	SteadyRequests   int64
	SteadyPerSecond  float64
	SteadyByKind     map[string]int64
	SteadyWrites     int
	SteadyCPUPercent float64 // of one core, all agents together
	OpenWatches      int64
	WatchesPerNode   float64
	Transports       int64

	// The wave: WaveGPUs GPUs on WaveNodes nodes fail at once.
	WaveGPUs  int
	WaveNodes int
	// Seconds from the injection until the last object of each kind was seen through a watch.
	WaveAnnotationsSeconds float64
	WaveRulesSeconds       float64
	WaveConditionsSeconds  float64
	// WaveAllSeconds is the later of the annotations and the rules: what schedulers read.
	WaveAllSeconds float64
	// Per-object latency of the taints and annotations (p50, p99).
	WaveP50Seconds float64
	WaveP99Seconds float64
	WaveRequests   int64
	// WaveRewatches counts the observer's watches the API server closed during the wave.
	WaveRewatches int
	WaveByKind    map[string]int64
	WaveWrites    map[string]int

	// The bare wave (GPUHEALTH_FLEET_BARE, on unless 0): the same writes sent by bare clients
	// with the agents' identity, rate limits and concurrency, no agent logic: the API server's
	// own time for the wave, which WaveAllSeconds is compared with.
	BareWaveAllSeconds float64
	BareWaveRequests   int64
	BareWaveByKind     map[string]int64

	// The heartbeat phase (heartbeatPhase): every agent started again with agent.heartbeat
	// HeartbeatPeriodSeconds, and over HeartbeatWindowSeconds of steady state, the agents'
	// writes (by reporter) and requests (by kind); HeartbeatPerNodePerPeriod is the writes per
	// node per period (issue 28's goal: at most 1).
	HeartbeatPeriodSeconds    float64
	HeartbeatWindowSeconds    float64
	HeartbeatWrites           map[string]int
	HeartbeatPerNodePerPeriod float64
	HeartbeatRequests         int64
	HeartbeatByKind           map[string]int64
}

// TestFleet runs GPUHEALTH_FLEET_NODES (default 500) simulated nodes × 8 GPUs, each with its own
// agent.Run and its own clientset (own rest.Config, transport and connection, as separate agent
// processes would have), against one kube-apiserver; measures start-up, memory per node, the API
// requests of the steady state, a wave in which one GPU in ten fails at once, and, with every
// agent started again on a short heartbeat, what the heartbeat costs (heartbeatPhase); and
// asserts only correctness: every expected DeviceTaintRule and annotation exists at the end,
// nothing else, each reporter wrote once per change, and the heartbeat writes nothing but its
// one patch, at most once a period. The figures are printed (and written to GPUHEALTH_FLEET_OUT
// as JSON), never asserted.
//
// The agents' ServiceAccount gets the FlowSchema and priority level the Helm chart installs
// (agent.FlowControl), as in production.
//
// Knobs: GPUHEALTH_FLEET=1 runs it; GPUHEALTH_FLEET_NODES; GPUHEALTH_FLEET_STEADY (a duration,
// default 30s); GPUHEALTH_FLEET_REPORTERS (comma-separated, default all);
// GPUHEALTH_FLEET_FLOWCONTROL=0 leaves the agents in the API server's default flow control;
// GPUHEALTH_FLEET_BREAKER=1 turns the circuit breaker on (a budget above the wave);
// GPUHEALTH_FLEET_BREAKER_FRACTION sets its share (default 0.2; below 0.1 part of the wave is
// held back, and the test checks that exactly the budget gets NoSchedule);
// GPUHEALTH_FLEET_HEARTBEAT, the heartbeat phase's agent.heartbeat (default 20s, at least 10s;
// 0 skips the phase), and GPUHEALTH_FLEET_HEARTBEAT_WINDOW, its window (default 3 periods, at
// least 2); GPUHEALTH_FLEET_KEEP=DIR keeps the control plane's logs and data in DIR.
func TestFleet(t *testing.T) {
	if os.Getenv("GPUHEALTH_FLEET") != "1" {
		t.Skip("the fleet test is heavy; set GPUHEALTH_FLEET=1 to run it (make bench does)")
	}
	nodes := envInt(t, "GPUHEALTH_FLEET_NODES", 500)
	steady := envDuration(t, "GPUHEALTH_FLEET_STEADY", 30*time.Second)
	reporters := config.AllReporters()
	if v := os.Getenv("GPUHEALTH_FLEET_REPORTERS"); v != "" {
		reporters = strings.Split(v, ",")
	}
	// Five hundred agents' informers log every cancelled watch at shutdown through klog's
	// global logger; the test's assertions say what went wrong, so that noise is dropped.
	klog.SetLogger(logr.Discard())
	t.Cleanup(klog.ClearLogger)
	flowControl := os.Getenv("GPUHEALTH_FLEET_FLOWCONTROL") != "0"
	withBreaker := os.Getenv("GPUHEALTH_FLEET_BREAKER") == "1"
	breakerFraction := envFloat(t, "GPUHEALTH_FLEET_BREAKER_FRACTION", 0.2)
	heartbeat, heartbeatWindow := heartbeatKnobs(t)
	fig := Figures{Nodes: nodes, GPUs: nodes * gpusPerNode, Reporters: reporters, SteadySeconds: steady.Seconds(), FlowControl: flowControl, Breaker: withBreaker}

	cpOpts := controlplane.Options{DisableScheduler: true, DisableControllerManager: true}
	if dir := os.Getenv("GPUHEALTH_FLEET_KEEP"); dir != "" {
		cpOpts.Dir, cpOpts.KeepDir = dir, true
	}
	c := controlplane.StartT(t, cpOpts)
	ctx := t.Context()
	adminCfg := c.AdminConfig()
	adminCfg.QPS = -1 // no client-side limit for the test's own setup and observation
	admin, err := kubernetes.NewForConfig(adminCfg)
	if err != nil {
		t.Fatal(err)
	}

	setupStart := time.Now()
	agentCfg := agentConfig(t, c, admin, withBreaker)
	if flowControl {
		installFlowControl(t, admin)
	}
	fleet := makeFleet(nodes)
	if err := createNodes(ctx, admin, fleet); err != nil {
		t.Fatal(err)
	}
	fig.SetupSeconds = time.Since(setupStart).Seconds()
	t.Logf("%d nodes and ResourceSlices created in %.1fs", nodes, fig.SetupSeconds)

	// Memory and goroutines before any agent or client exists.
	heap0, rss0, gr0 := memory(t)

	counter := newRequestCounter()
	agentCtx, stopAgents := context.WithCancel(klog.NewContext(ctx, logr.Discard()))
	var agents errgroup.Group
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		stopAgents()
		if err := agents.Wait(); err != nil {
			t.Errorf("agent: %v", err)
		}
	}
	defer stop()

	// Heartbeats an hour apart: none in the steady window or the waves (agents started together
	// would all beat in the same half minute, five minutes on); the heartbeat phase measures them.
	agentSettings := config.AgentConfig{CheckpointPath: "-", Resync: ptrDuration(time.Hour), Heartbeat: ptrDuration(time.Hour), Reporters: reporters}
	if withBreaker {
		// The breaker's controller counts the cluster's GPUs from the agents' annotations, as
		// the chart's Deployment does.
		counterCtx, stopCounter := context.WithCancel(klog.NewContext(ctx, logr.Discard()))
		counterDone := make(chan error, 1)
		go func() {
			counterDone <- (&breaker.Counter{Client: adapt.Clientset(admin), Namespace: agentNamespace}).Run(counterCtx)
		}()
		t.Cleanup(func() {
			stopCounter()
			if err := <-counterDone; err != nil {
				t.Errorf("breaker counter: %v", err)
			}
		})
		// The wave is exactly 10% of the GPUs: the default budget of 20% admits all of it, so
		// the final state is the same and the figures show what the shared budget costs; a
		// smaller fraction holds part of the wave back, and the wave checks that exactly the
		// budget got NoSchedule while hundreds of agents raced for it.
		agentSettings.CircuitBreaker = config.CircuitBreakerConfig{Enabled: true, MaxFraction: breakerFraction, Namespace: agentNamespace}
		fig.BreakerBudget = breaker.Budget(breakerFraction, fig.GPUs)
	}
	start := time.Now()
	for _, n := range fleet {
		cfg := rest.CopyConfig(agentCfg)
		cfg.QPS, cfg.Burst = agent.ClientQPS, agent.ClientBurst // as `gpuhealth agent` runs
		// A Proxy function makes client-go's transport uncacheable, so every agent gets its own
		// transport and its own connection, as separate processes would (client-go otherwise
		// shares one transport among identical configs). It returns no proxy.
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
		cfg.WrapTransport = counter.wrap
		client, err := kube.NewForConfig(cfg) // the agent's own client
		if err != nil {
			t.Fatal(err)
		}
		n.client = client
		agents.Go(func() error { return runAgent(agentCtx, n, agentSettings) })
	}
	if err := waitReady(ctx, fleet); err != nil {
		t.Fatal(err)
	}
	fig.StartupSeconds = time.Since(start).Seconds()
	startup := counter.snapshot()
	fig.StartupRequests, fig.StartupByKind = total(startup), startup
	t.Logf("%d agents ready in %.1fs after %d requests", nodes, fig.StartupSeconds, fig.StartupRequests)
	if withBreaker {
		waitBreakerCount(t, admin, nodes*gpusPerNode)
	}

	// Let the start-up's stragglers (the condition writer, watches opening) settle, then measure.
	time.Sleep(5 * time.Second)
	heap1, rss1, gr1 := memory(t)
	fig.HeapPerNodeKiB = float64(heap1-heap0) / 1024 / float64(nodes)
	fig.RSSPerNodeKiB = float64(rss1-rss0) / 1024 / float64(nodes)
	fig.GoroutinesPerNode = float64(gr1-gr0) / float64(nodes)

	before, writesBefore, cpuBefore := counter.snapshot(), fleetWrites(t, fleet), processCPU(t)
	time.Sleep(steady)
	after, writesAfter, cpuAfter := counter.snapshot(), fleetWrites(t, fleet), processCPU(t)
	fig.SteadyByKind = diff(after, before)
	fig.SteadyRequests = total(fig.SteadyByKind)
	fig.SteadyPerSecond = float64(fig.SteadyRequests) / steady.Seconds()
	fig.SteadyWrites = sumWrites(writesAfter) - sumWrites(writesBefore)
	fig.SteadyCPUPercent = 100 * (cpuAfter - cpuBefore).Seconds() / steady.Seconds()
	fig.OpenWatches = counter.openWatches.Load()
	fig.WatchesPerNode = float64(fig.OpenWatches) / float64(nodes)
	fig.Transports = counter.transports.Load()

	wave(t, admin, fleet, counter, &fig)
	if os.Getenv("GPUHEALTH_FLEET_BARE") != "0" {
		bareWave(t, admin, agentCfg, fleet, &fig)
	}

	stop()
	if heartbeat > 0 {
		heartbeatPhase(t, admin, fleet, counter, agentSettings, heartbeat, heartbeatWindow, &fig)
	}
	report(t, fig)
}

// runAgent runs n's agent with settings until ctx is done, as `gpuhealth agent` would on the
// node, with n's client, backend and registry.
func runAgent(ctx context.Context, n *fleetNode, settings config.AgentConfig) error {
	err := agent.Run(ctx, agent.Options{
		NodeName: n.name, Client: n.client, Backend: n.backend, Policy: health.DefaultPolicy(), BootID: "fleet-boot",
		Agent:          settings,
		MetricsAddress: "127.0.0.1:0",
		Ready:          func(addr string) { n.addr.Store(addr) },
		Registry:       n.registry,
	})
	if err != nil {
		return fmt.Errorf("%s: %w", n.name, err)
	}
	return nil
}

// fleetNode is one simulated node: its name, GPUs, the channel backend its agent reads, the
// agent's own client (kept for the heartbeat phase's agents) and the agent's metrics.
type fleetNode struct {
	name     string
	uuids    []string
	backend  *agenttest.Backend
	client   kube.Interface
	registry *prometheus.Registry
	addr     atomic.Value // string: the agent's /readyz address once it listens
}

func makeFleet(n int) []*fleetNode {
	fleet := make([]*fleetNode, n)
	for i := range fleet {
		name := fmt.Sprintf("fleet-%04d", i)
		node := &fleetNode{name: name, registry: prometheus.NewRegistry(), backend: &agenttest.Backend{Signals: make(chan health.Signal, gpusPerNode)}}
		for g := range gpusPerNode {
			u := sim.GPUUUID(name, g)
			node.uuids = append(node.uuids, u)
			node.backend.GPUs = append(node.backend.GPUs, health.Device{UUID: u, Index: g, Model: "fleet"})
		}
		fleet[i] = node
	}
	return fleet
}

// agentConfig gives the agents a ServiceAccount bound to agent.ClusterRoleRules (least privilege,
// as the chart does) and returns its rest.Config. Every agent shares the ServiceAccount, as a
// DaemonSet's pods do.
func agentConfig(t *testing.T, c *controlplane.Cluster, admin kubernetes.Interface, breaker bool) *rest.Config {
	t.Helper()
	ctx := t.Context()
	if _, err := c.CreateNamespace(ctx, agentNamespace); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := agenttest.Grant(ctx, admin, agentAccount, agentNamespace, agentAccount); err != nil {
		t.Fatal(err)
	}
	if breaker {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: agentAccount + "-breaker"}, Rules: agent.BreakerRoleRules()}
		if _, err := admin.RbacV1().Roles(agentNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: role.Name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: agentNamespace, Name: agentAccount}},
		}
		if _, err := admin.RbacV1().RoleBindings(agentNamespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := c.ServiceAccountConfig(ctx, agentNamespace, agentAccount)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// waitBreakerCount waits until the breaker's ConfigMap holds the cluster's GPU count.
func waitBreakerCount(t *testing.T, admin kubernetes.Interface, want int) {
	t.Helper()
	deadline := time.Now().Add(convergeLimit)
	for {
		cm, err := admin.CoreV1().ConfigMaps(agentNamespace).Get(t.Context(), breaker.ConfigMapName, metav1.GetOptions{})
		if err == nil {
			if n, _ := breaker.ParseState(cm); n == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the breaker's count never reached %d GPUs: %v, %v", want, cm, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// installFlowControl creates the FlowSchema and priority level the chart installs for the agents
// and waits until the API server uses them.
func installFlowControl(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	schema, level := agent.FlowControl(agentAccount, agentNamespace, agentAccount, agent.DefaultFlowQueueLength)
	if _, err := admin.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, level, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.FlowcontrolV1().FlowSchemas().Create(ctx, schema, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server's flow-control configuration controller marks a schema it has taken in
	// with a Dangling condition (False: its priority level exists).
	deadline := time.Now().Add(30 * time.Second)
	for {
		fs, err := admin.FlowcontrolV1().FlowSchemas().Get(ctx, schema.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range fs.Status.Conditions {
			if c.Type == flowcontrolv1.FlowSchemaConditionDangling && c.Status == flowcontrolv1.ConditionFalse {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("FlowSchema %s not taken in by the API server after 30s: %+v", schema.Name, fs.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createNodes creates each node (Ready, as a kubelet would report it) and its ResourceSlice
// of 8 GPUs shaped like NVIDIA's DRA driver's, a few at a time.
func createNodes(ctx context.Context, admin kubernetes.Interface, fleet []*fleetNode) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, n := range fleet {
		g.Go(func() error {
			node := controlplane.Node(n.name)
			node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}
			if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create node %s: %w", n.name, err)
			}
			if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(n.name, n.uuids...), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create ResourceSlice of %s: %w", n.name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// waitReady polls every agent's /readyz until all say ok.
func waitReady(ctx context.Context, fleet []*fleetNode) error {
	httpClient := &http.Client{Timeout: 5 * time.Second}
	pending := slices.Clone(fleet)
	deadline := time.Now().Add(convergeLimit)
	for len(pending) > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d agents not ready after %v (first: %s)", len(pending), len(fleet), convergeLimit, pending[0].name)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		pending = slices.DeleteFunc(pending, func(n *fleetNode) bool {
			addr, _ := n.addr.Load().(string)
			if addr == "" {
				return false
			}
			resp, err := httpClient.Get("http://" + addr + "/readyz")
			if err != nil {
				return false
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		if len(pending) > 0 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// wave fails one GPU in ten at once and waits, through watches, until every DeviceTaintRule,
// annotation and condition it implies is in the API server; then checks the final state.
func wave(t *testing.T, admin kubernetes.Interface, fleet []*fleetNode, counter *requestCounter, fig *Figures) {
	t.Helper()
	ctx := t.Context()
	failing, wantIDs, wantRules := waveTargets(fleet)
	fig.WaveGPUs, fig.WaveNodes = len(wantRules), len(wantIDs)
	nodes, rules := observeNodesAndRules(admin)
	watchCtx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	for _, o := range []*observed{nodes, rules} {
		existing, err := o.start(watchCtx)
		if err != nil {
			t.Fatal(err)
		}
		if o == rules && len(existing) != 0 {
			t.Fatalf("%d DeviceTaintRules before the wave, want none", len(existing))
		}
	}

	writesBefore := fleetWrites(t, fleet)
	before := counter.snapshot()
	injected := time.Now()
	for n, idx := range failing {
		for _, g := range idx {
			n.backend.Signals <- health.Signal{Kind: health.SignalXID, Device: n.uuids[g], XID: waveXID, Time: injected}
		}
	}

	effects := &effectCount{effects: map[string]resourcev1.DeviceTaintEffect{}}
	pendingIDs := maps.Clone(wantIDs)
	pendingConds := maps.Clone(wantIDs)
	pendingRules := maps.Clone(wantRules)
	var lat []time.Duration // per object: annotation or rule
	var lastIDs, lastRules, lastConds time.Duration
	deadline := time.After(convergeLimit)
	for len(pendingIDs)+len(pendingRules)+len(pendingConds) > 0 {
		var obj k8sruntime.Object
		select {
		case obj = <-nodes.objects:
		case obj = <-rules.objects:
		case err := <-nodes.errs:
			t.Fatal(err)
		case err := <-rules.errs:
			t.Fatal(err)
		case <-deadline:
			t.Fatalf("after %v: %d annotations, %d DeviceTaintRules and %d conditions still missing", convergeLimit, len(pendingIDs), len(pendingRules), len(pendingConds))
		}
		now := time.Since(injected)
		switch obj := obj.(type) {
		case *corev1.Node:
			if want, ok := pendingIDs[obj.Name]; ok && obj.Annotations[gpuhealthv1.UnhealthyIDsKey] == want {
				delete(pendingIDs, obj.Name)
				lat, lastIDs = append(lat, now), now
			}
			if _, ok := pendingConds[obj.Name]; ok && conditionTrue(obj) {
				delete(pendingConds, obj.Name)
				lastConds = now
			}
		case *resourcev1.DeviceTaintRule:
			effects.see(obj)
			if pendingRules[obj.Name] {
				delete(pendingRules, obj.Name)
				lat, lastRules = append(lat, now), now
			}
		}
	}
	held := fig.BreakerBudget > 0 && fig.BreakerBudget < len(wantRules)
	if held {
		// Part of the wave is held back: wait until exactly the budget has NoSchedule (agents
		// that lost every race for a slot retry), watching that it is never exceeded.
		for effects.disruptive() != fig.BreakerBudget {
			select {
			case obj := <-rules.objects:
				if r, ok := obj.(*resourcev1.DeviceTaintRule); ok {
					effects.see(r)
				}
			case err := <-rules.errs:
				t.Fatal(err)
			case <-deadline:
				t.Fatalf("after %v: %d rules NoSchedule, want the budget of %d", convergeLimit, effects.disruptive(), fig.BreakerBudget)
			}
		}
		fig.BreakerSettleSeconds = time.Since(injected).Seconds()
	}
	fig.BreakerMaxDisruptive = effects.max
	if fig.BreakerBudget > 0 && effects.max > fig.BreakerBudget {
		t.Errorf("%d rules had a disruptive effect at once, past the circuit breaker's budget of %d", effects.max, fig.BreakerBudget)
	}
	stopWatches()
	fig.WaveRewatches = int(nodes.rewatches.Load() + rules.rewatches.Load())
	fig.WaveAnnotationsSeconds, fig.WaveRulesSeconds, fig.WaveConditionsSeconds = lastIDs.Seconds(), lastRules.Seconds(), lastConds.Seconds()
	fig.WaveAllSeconds = max(lastIDs, lastRules).Seconds()
	slices.Sort(lat)
	fig.WaveP50Seconds, fig.WaveP99Seconds = percentile(lat, 0.50).Seconds(), percentile(lat, 0.99).Seconds()

	// Let the writers settle (Events are batched by the broadcaster), then count and check.
	time.Sleep(3 * time.Second)
	fig.WaveByKind = diff(counter.snapshot(), before)
	fig.WaveRequests = total(fig.WaveByKind)
	writesAfter := fleetWrites(t, fleet)
	fig.WaveWrites = map[string]int{}
	for k, v := range writesAfter {
		fig.WaveWrites[k] = v - writesBefore[k]
	}
	checkFinalState(t, admin, fleet, wantIDs, wantRules)
	if held {
		checkBudget(t, admin, fig.BreakerBudget, len(wantRules))
	}
	for sink, want := range map[string]int{"annotation": len(wantIDs), "devicetaint": len(wantRules), "condition": len(wantIDs)} {
		if held && sink != "annotation" {
			continue // held GPUs may be written twice (None, then NoSchedule) and get the breaker's condition
		}
		if slices.Contains(fig.Reporters, sink) && fig.WaveWrites[sink] != want {
			t.Errorf("%s: %d writes for the wave, want %d (one per changed object)", sink, fig.WaveWrites[sink], want)
		}
	}
}

// waveTargets returns the wave's failing GPUs: every tenth of the fleet, so at most one per node
// (8 in a row hold at most one multiple of 10), spread over the nodes like independent failures;
// with the volcano.sh/gpu-unhealthy-ids each failing node must get and the rules expected.
func waveTargets(fleet []*fleetNode) (failing map[*fleetNode][]int, wantIDs map[string]string, wantRules map[string]bool) {
	failing, wantIDs, wantRules = map[*fleetNode][]int{}, map[string]string{}, map[string]bool{}
	for i, n := range fleet {
		for g := range gpusPerNode {
			if (i*gpusPerNode+g)%waveEvery != 0 {
				continue
			}
			failing[n] = append(failing[n], g)
			wantRules[devicetaint.RuleName(n.name, n.uuids[g])] = true
		}
	}
	for n, idx := range failing {
		ids := make([]string, len(idx))
		for i, g := range idx {
			ids[i] = strconv.Itoa(g)
		}
		wantIDs[n.name] = strings.Join(ids, ",")
	}
	return failing, wantIDs, wantRules
}

// observeNodesAndRules returns observers of the Nodes and the DeviceTaintRules. Each watches from
// the resourceVersion of its start, so every event seen is new. A watch the API server closes (an
// overloaded server drops a watcher that falls behind) is reopened after a fresh LIST, whose
// items count as seen then: nothing is missed, only seen later.
func observeNodesAndRules(admin kubernetes.Interface) (nodes, rules *observed) {
	nodes = &observed{
		list: listing(func(ctx context.Context, o metav1.ListOptions) (k8sruntime.Object, error) {
			return admin.CoreV1().Nodes().List(ctx, o)
		}),
		watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return admin.CoreV1().Nodes().Watch(ctx, opts)
		},
	}
	rules = &observed{
		list: listing(func(ctx context.Context, o metav1.ListOptions) (k8sruntime.Object, error) {
			return admin.ResourceV1().DeviceTaintRules().List(ctx, o)
		}),
		watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return admin.ResourceV1().DeviceTaintRules().Watch(ctx, opts)
		},
	}
	return nodes, rules
}

// effectCount follows the effect of every rule seen, and the most rules ever seen with a
// disruptive effect (NoSchedule or NoExecute) at once.
type effectCount struct {
	effects map[string]resourcev1.DeviceTaintEffect
	max     int
}

func (e *effectCount) see(r *resourcev1.DeviceTaintRule) {
	e.effects[r.Name] = r.Spec.Taint.Effect
	e.max = max(e.max, e.disruptive())
}

func (e *effectCount) disruptive() int {
	n := 0
	for _, eff := range e.effects {
		if eff != resourcev1.DeviceTaintEffectNone {
			n++
		}
	}
	return n
}

// checkBudget lists the rules and checks that exactly budget of the wave's GPUs have NoSchedule
// and the rest None.
func checkBudget(t *testing.T, admin kubernetes.Interface, budget, wave int) {
	t.Helper()
	rules, err := admin.ResourceV1().DeviceTaintRules().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byEffect := map[resourcev1.DeviceTaintEffect]int{}
	for _, r := range rules.Items {
		byEffect[r.Spec.Taint.Effect]++
	}
	if byEffect[resourcev1.DeviceTaintEffectNoSchedule] != budget || byEffect[resourcev1.DeviceTaintEffectNone] != wave-budget {
		t.Errorf("rules by effect %v, want %d NoSchedule (the budget) and %d None", byEffect, budget, wave-budget)
	}
}

// listing adapts a typed List call to observed.list: the list's resourceVersion and its items.
func listing(list func(context.Context, metav1.ListOptions) (k8sruntime.Object, error)) func(context.Context) (string, []k8sruntime.Object, error) {
	return func(ctx context.Context) (string, []k8sruntime.Object, error) {
		l, err := list(ctx, metav1.ListOptions{})
		if err != nil {
			return "", nil, err
		}
		items, err := meta.ExtractList(l)
		if err != nil {
			return "", nil, err
		}
		acc, err := meta.ListAccessor(l)
		if err != nil {
			return "", nil, err
		}
		return acc.GetResourceVersion(), items, nil
	}
}

// observed follows one kind of object through a watch and hands every added or modified object
// to objects; when the API server closes the watch it lists again (handing over every item) and
// watches from there.
type observed struct {
	list      func(context.Context) (string, []k8sruntime.Object, error)
	watch     func(context.Context, metav1.ListOptions) (watch.Interface, error)
	objects   chan k8sruntime.Object
	errs      chan error
	rewatches atomic.Int64
}

// start lists, returns the items there now, and follows changes from there until ctx is done.
func (o *observed) start(ctx context.Context) ([]k8sruntime.Object, error) {
	o.objects, o.errs = make(chan k8sruntime.Object, 1024), make(chan error, 1)
	rv, items, err := o.list(ctx)
	if err != nil {
		return nil, err
	}
	w, err := o.watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
	if err != nil {
		return nil, err
	}
	go func() {
		defer func() { w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
					select {
					case o.objects <- ev.Object:
					case <-ctx.Done():
						return
					}
				}
				if ok && ev.Type != watch.Error {
					continue
				}
				// Closed, or an error (such as a resourceVersion too old): list and watch again.
				w.Stop()
				o.rewatches.Add(1)
				rv, items, err := o.list(ctx)
				if err == nil {
					w, err = o.watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
				}
				if err != nil {
					if ctx.Err() == nil {
						o.errs <- err
					}
					return
				}
				for _, obj := range items {
					select {
					case o.objects <- obj:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return items, nil
}

// checkFinalState lists what the API server holds and compares it with the wave's expectation:
// exactly the expected rules, and the expected unhealthy-ids annotation on exactly the failing
// nodes (the other nodes have none).
func checkFinalState(t *testing.T, admin kubernetes.Interface, fleet []*fleetNode, wantIDs map[string]string, wantRules map[string]bool) {
	t.Helper()
	ctx := t.Context()
	rules, err := admin.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range rules.Items {
		got[r.Name] = true
		if !wantRules[r.Name] {
			t.Errorf("unexpected DeviceTaintRule %s", r.Name)
		}
	}
	for name := range wantRules {
		if !got[name] {
			t.Errorf("DeviceTaintRule %s missing", name)
		}
	}
	nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != len(fleet) {
		t.Errorf("%d nodes, want %d", len(nodes.Items), len(fleet))
	}
	for _, n := range nodes.Items {
		if got, want := n.Annotations[gpuhealthv1.UnhealthyIDsKey], wantIDs[n.Name]; got != want {
			t.Errorf("node %s: %s=%q, want %q", n.Name, gpuhealthv1.UnhealthyIDsKey, got, want)
		}
		if n.Annotations[gpuhealthv1.HealthKey] == "" {
			t.Errorf("node %s: no %s annotation", n.Name, gpuhealthv1.HealthKey)
		}
	}
}

func conditionTrue(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == nodecondition.Type {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func report(t *testing.T, fig Figures) {
	t.Helper()
	var b strings.Builder
	flow := "the chart's FlowSchema and priority level"
	if !fig.FlowControl {
		flow = "default flow control"
	}
	if fig.Breaker {
		flow += fmt.Sprintf(", circuit breaker on (budget %d GPUs)", fig.BreakerBudget)
	}
	fmt.Fprintf(&b, "fleet: %d nodes × %d GPUs, one agent and one client each, reporters %s, %s, kube-apiserver %s on loopback\n",
		fig.Nodes, gpusPerNode, strings.Join(fig.Reporters, ","), flow, controlplane.KubernetesVersion)
	fmt.Fprintf(&b, "| figure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| setup (Nodes + ResourceSlices) | %.1f s |\n", fig.SetupSeconds)
	fmt.Fprintf(&b, "| start-up: all agents ready | %.1f s, %d requests (%s) |\n", fig.StartupSeconds, fig.StartupRequests, kinds(fig.StartupByKind))
	fmt.Fprintf(&b, "| memory per node | heap %.0f KiB, RSS %.0f KiB, %.1f goroutines |\n", fig.HeapPerNodeKiB, fig.RSSPerNodeKiB, fig.GoroutinesPerNode)
	fmt.Fprintf(&b, "| open watches | %d (%.1f per node) over %d client transports |\n", fig.OpenWatches, fig.WatchesPerNode, fig.Transports)
	fmt.Fprintf(&b, "| steady state, %.0f s | %.2f requests/s (%s), %d writes, agents' CPU %.1f%% of a core |\n",
		fig.SteadySeconds, fig.SteadyPerSecond, kinds(fig.SteadyByKind), fig.SteadyWrites, fig.SteadyCPUPercent)
	fmt.Fprintf(&b, "| wave: %d GPUs on %d nodes fail at once | all taints and annotations in %.2f s (annotations %.2f s, rules %.2f s; per object p50 %.2f s, p99 %.2f s); conditions %.2f s |\n",
		fig.WaveGPUs, fig.WaveNodes, fig.WaveAllSeconds, fig.WaveAnnotationsSeconds, fig.WaveRulesSeconds, fig.WaveP50Seconds, fig.WaveP99Seconds, fig.WaveConditionsSeconds)
	fmt.Fprintf(&b, "| wave: API requests | %d (%s); writes %v; observer re-watches %d |\n", fig.WaveRequests, kinds(fig.WaveByKind), fig.WaveWrites, fig.WaveRewatches)
	if fig.BareWaveRequests > 0 {
		fmt.Fprintf(&b, "| bare wave: the same writes, no agent logic | all in %.2f s, %d requests (%s): the agents took %.2f× |\n",
			fig.BareWaveAllSeconds, fig.BareWaveRequests, kinds(fig.BareWaveByKind), fig.WaveAllSeconds/fig.BareWaveAllSeconds)
	}
	if fig.HeartbeatPeriodSeconds > 0 {
		fmt.Fprintf(&b, "| heartbeat every %.0f s (agents started again), %.0f s window | %d writes %v, %d requests (%s): %.3f writes per node per period (goal ≤ 1); at the default %g min, %.1f writes/s for %d nodes |\n",
			fig.HeartbeatPeriodSeconds, fig.HeartbeatWindowSeconds, sumWrites(fig.HeartbeatWrites), fig.HeartbeatWrites, fig.HeartbeatRequests, kinds(fig.HeartbeatByKind),
			fig.HeartbeatPerNodePerPeriod, config.DefaultHeartbeat.Minutes(), defaultHeartbeatRate(fig.Nodes, fig.HeartbeatPerNodePerPeriod), fig.Nodes)
	}
	if fig.BreakerSettleSeconds > 0 {
		fmt.Fprintf(&b, "| wave: circuit breaker | exactly the budget of %d GPUs NoSchedule after %.2f s, the rest None; never more than %d at once |\n",
			fig.BreakerBudget, fig.BreakerSettleSeconds, fig.BreakerMaxDisruptive)
	}
	fmt.Println(b.String())
	if path := os.Getenv("GPUHEALTH_FLEET_OUT"); path != "" {
		if err := figure.WriteFile(path, fig.figures()...); err != nil {
			t.Error(err)
		}
	}
}

// figures are fig as package figure's figures, under the names hack/bench looks for.
func (fig Figures) figures() []figure.Figure {
	one := func(name, unit string, v float64) figure.Figure {
		return figure.Figure{Name: name, Unit: unit, Value: v}
	}
	requests := func(name string, v int64, byKind map[string]int64) figure.Figure {
		f := one(name, figure.UnitRequests, float64(v))
		f.By = floats(byKind)
		return f
	}
	writes := one(figure.FleetWaveWrites, figure.UnitWrites, float64(sumWrites(fig.WaveWrites)))
	writes.By = floats(fig.WaveWrites)
	latency := one(figure.FleetWaveObjectLatency, figure.UnitSeconds, fig.WaveP50Seconds)
	latency.Percentiles = map[string]float64{figure.P50: fig.WaveP50Seconds, figure.P99: fig.WaveP99Seconds}
	figs := []figure.Figure{
		one(figure.FleetNodes, figure.UnitNodes, float64(fig.Nodes)),
		one(figure.FleetGPUs, figure.UnitGPUs, float64(fig.GPUs)),
		one(figure.FleetSetupTime, figure.UnitSeconds, fig.SetupSeconds),
		one(figure.FleetStartupTime, figure.UnitSeconds, fig.StartupSeconds),
		requests(figure.FleetStartupRequests, fig.StartupRequests, fig.StartupByKind),
		one(figure.FleetHeapPerNode, figure.UnitKiB, fig.HeapPerNodeKiB),
		one(figure.FleetRSSPerNode, figure.UnitKiB, fig.RSSPerNodeKiB),
		one(figure.FleetGoroutinesPerNode, figure.UnitGoroutines, fig.GoroutinesPerNode),
		one(figure.FleetOpenWatches, figure.UnitWatches, float64(fig.OpenWatches)),
		one(figure.FleetWatchesPerNode, figure.UnitWatches, fig.WatchesPerNode),
		one(figure.FleetClientTransports, figure.UnitTransports, float64(fig.Transports)),
		one(figure.FleetSteadyWindow, figure.UnitSeconds, fig.SteadySeconds),
		requests(figure.FleetSteadyRequests, fig.SteadyRequests, fig.SteadyByKind),
		one(figure.FleetSteadyRequestRate, figure.UnitRequestsPerSecond, fig.SteadyPerSecond),
		one(figure.FleetSteadyWrites, figure.UnitWrites, float64(fig.SteadyWrites)),
		one(figure.FleetSteadyCPU, figure.UnitCPU, fig.SteadyCPUPercent),
		one(figure.FleetWaveGPUs, figure.UnitGPUs, float64(fig.WaveGPUs)),
		one(figure.FleetWaveNodes, figure.UnitNodes, float64(fig.WaveNodes)),
		one(figure.FleetWaveAnnotationsTime, figure.UnitSeconds, fig.WaveAnnotationsSeconds),
		one(figure.FleetWaveRulesTime, figure.UnitSeconds, fig.WaveRulesSeconds),
		one(figure.FleetWaveConditionsTime, figure.UnitSeconds, fig.WaveConditionsSeconds),
		one(figure.FleetWaveAllTime, figure.UnitSeconds, fig.WaveAllSeconds),
		latency,
		requests(figure.FleetWaveRequests, fig.WaveRequests, fig.WaveByKind),
		writes,
		one(figure.FleetWaveRewatches, figure.UnitWatches, float64(fig.WaveRewatches)),
	}
	if fig.BareWaveRequests > 0 {
		figs = append(figs, one(figure.FleetBareWaveAllTime, figure.UnitSeconds, fig.BareWaveAllSeconds),
			requests(figure.FleetBareWaveRequests, fig.BareWaveRequests, fig.BareWaveByKind))
	}
	if fig.HeartbeatPeriodSeconds > 0 {
		beats := one(figure.FleetHeartbeatWrites, figure.UnitWrites, float64(sumWrites(fig.HeartbeatWrites)))
		beats.By = floats(fig.HeartbeatWrites)
		figs = append(figs, one(figure.FleetHeartbeatPeriod, figure.UnitSeconds, fig.HeartbeatPeriodSeconds),
			one(figure.FleetHeartbeatWindow, figure.UnitSeconds, fig.HeartbeatWindowSeconds),
			beats,
			one(figure.FleetHeartbeatPerNodePerPeriod, figure.UnitWritesPerNodePerPeriod, fig.HeartbeatPerNodePerPeriod),
			requests(figure.FleetHeartbeatRequests, fig.HeartbeatRequests, fig.HeartbeatByKind))
	}
	if fig.Breaker {
		figs = append(figs, one(figure.FleetBreakerBudget, figure.UnitGPUs, float64(fig.BreakerBudget)))
	}
	if fig.BreakerSettleSeconds > 0 { // the budget was below the wave
		figs = append(figs, one(figure.FleetBreakerSettleTime, figure.UnitSeconds, fig.BreakerSettleSeconds),
			one(figure.FleetBreakerMaxDisruptive, figure.UnitGPUs, float64(fig.BreakerMaxDisruptive)))
	}
	return figs
}

func floats[N int | int64](m map[string]N) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = float64(v)
	}
	return out
}

// requestCounter counts the requests of every agent's client by kind ("PATCH nodes",
// "WATCH devicetaintrules", ...) through rest.Config.WrapTransport, the failed ones again by
// status ("failed 429"), and the watches open now.
type requestCounter struct {
	mu          sync.Mutex
	counts      map[string]int64
	openWatches atomic.Int64
	transports  atomic.Int64
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
		resp, err := rt.RoundTrip(r)
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

// memory returns the Go heap in use and the process RSS (bytes) after a GC, and the goroutines.
func memory(t *testing.T) (heap, rss uint64, goroutines int) {
	t.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kib, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			rss = kib * 1024
		}
	}
	return ms.HeapInuse, rss, runtime.NumGoroutine()
}

// processCPU is the user and system CPU time this process has used (every agent, plus the
// test's own idle loops).
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("parse /proc/self/stat: %v %v", err1, err2)
	}
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ is 100 on Linux
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(float64(len(sorted)-1)*p)]
}

func ptrDuration(d time.Duration) *config.Duration {
	v := config.Duration(d)
	return &v
}

func envInt(t *testing.T, key string, def int) int {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", key, v)
	}
	return n
}

func envFloat(t *testing.T, key string, def float64) float64 {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 1 {
		t.Fatalf("%s=%q: want a fraction in (0, 1]", key, v)
	}
	return f
}

func envDuration(t *testing.T, key string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration", key, v)
	}
	return d
}
