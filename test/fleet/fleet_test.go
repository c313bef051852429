//go:build e2e

package fleet

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/agent/agenttest"
	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/scheduling"
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
	// failure, but the figures themselves are never asserted (a 10% wave on 50,000 nodes takes
	// minutes on 2 cores).
	convergeLimit = 15 * time.Minute
)

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
//
// At scale (issue 49): GPUHEALTH_FLEET_AGENTS (default: every node) is how many nodes run a real
// agent; the others are written as an agent writes them (simulated_test.go).
// GPUHEALTH_FLEET_AGENT_HEARTBEAT is the main run's agent.heartbeat (default 1h: no renewal in
// the steady window or the waves), at which the simulated nodes renew their Leases too.
// GPUHEALTH_FLEET_FAULTS single faults (default 0 when every node has a real agent, else 40; the
// simulated nodes' wave copies what the agents wrote for them) are timed one at a time before the
// wave; GPUHEALTH_FLEET_READERS=1 then measures the extender, the breaker counter and
// `gpuhealth status` over the whole fleet (GPUHEALTH_FLEET_GPUHEALTH: the gpuhealth binary).
// GPUHEALTH_FLEET_FLOW_QUEUE is agent.flowControl.queueLengthLimit (default the chart's: four
// requests per node that changes at once, so a 10% wave on 50,000 nodes wants 160,000).
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
	realAgents := min(envInt(t, "GPUHEALTH_FLEET_AGENTS", nodes), nodes)
	agentBeat := envDuration(t, "GPUHEALTH_FLEET_AGENT_HEARTBEAT", time.Hour)
	faultCount := 0
	if realAgents < nodes {
		faultCount = 40
	}
	if v := os.Getenv("GPUHEALTH_FLEET_FAULTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("GPUHEALTH_FLEET_FAULTS=%q: want a count", v)
		}
		faultCount = n
	}
	fig := Figures{Nodes: nodes, GPUs: nodes * gpusPerNode, Reporters: reporters, SteadySeconds: steady.Seconds(), FlowControl: flowControl, Breaker: withBreaker,
		Agents: realAgents, AgentHeartbeatSeconds: agentBeat.Seconds(), Readers: os.Getenv("GPUHEALTH_FLEET_READERS") == "1"}

	cpOpts := controlplane.Options{DisableScheduler: true, DisableControllerManager: true}
	if dir := os.Getenv("GPUHEALTH_FLEET_KEEP"); dir != "" {
		cpOpts.Dir, cpOpts.KeepDir = dir, true
	}
	c := controlplane.StartT(t, cpOpts)
	ctx := t.Context()
	adminCfg := c.AdminConfig()
	adminCfg = protobuf(adminCfg) // no client-side limit for the test's own setup and observation
	admin, err := kubernetes.NewForConfig(adminCfg)
	if err != nil {
		t.Fatal(err)
	}

	setupStart := time.Now()
	agentCfg := agentConfig(t, c, admin, withBreaker)
	if flowControl {
		installFlowControl(t, admin, envInt(t, "GPUHEALTH_FLEET_FLOW_QUEUE", agent.DefaultFlowQueueLength))
	}
	fleet := makeFleet(nodes)
	var simulated []int
	for i := realAgents; i < nodes; i++ {
		fleet[i].simulated = true
		simulated = append(simulated, i)
	}
	agentNodes := fleet[:realAgents]
	if err := createNodes(ctx, admin, agentNodes); err != nil {
		t.Fatal(err)
	}
	fig.SetupSeconds = time.Since(setupStart).Seconds()
	t.Logf("%d nodes and ResourceSlices created in %.1fs", realAgents, fig.SetupSeconds)

	// Memory and goroutines before any agent or client exists.
	heap0, rss0, gr0 := memory(t)

	counter := newRequestCounter()
	agentCtx, stopAgents := context.WithCancel(klog.NewContext(ctx, logr.Discard()))
	var agents errgroup.Group
	sims := newSimFleet(t, agentCfg, counter, agentBeat)
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
		sims.renewed.Wait()
	}
	defer stop()

	// Heartbeats an hour apart: none in the steady window or the waves (agents started together
	// would all beat in the same half minute, five minutes on); the heartbeat phase measures them.
	agentSettings := config.AgentConfig{CheckpointPath: "-", Resync: ptrDuration(time.Hour), Heartbeat: ptrDuration(agentBeat), Reporters: reporters}
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
	for _, n := range agentNodes {
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
	if err := waitReady(ctx, agentNodes); err != nil {
		t.Fatal(err)
	}
	fig.StartupSeconds = time.Since(start).Seconds()
	startup := counter.snapshot()
	fig.StartupRequests, fig.StartupByKind = total(startup), startup
	t.Logf("%d agents ready in %.1fs after %d requests", realAgents, fig.StartupSeconds, fig.StartupRequests)

	// Let the start-up's stragglers (the condition writer, watches opening) settle, then measure.
	time.Sleep(5 * time.Second)
	heap1, rss1, gr1 := memory(t)
	fig.HeapPerNodeKiB = float64(heap1-heap0) / 1024 / float64(realAgents)
	fig.RSSPerNodeKiB = float64(rss1-rss0) / 1024 / float64(realAgents)
	fig.GoroutinesPerNode = float64(gr1-gr0) / float64(realAgents)

	if len(simulated) > 0 {
		// The other nodes, as the real agents left theirs at start-up.
		simStart := time.Now()
		startWrites, err := startupWrites(ctx, admin, fleet[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := createSimulated(ctx, admin, fleet, simulated, startWrites, agentBeat); err != nil {
			t.Fatal(err)
		}
		fig.SetupSeconds += time.Since(simStart).Seconds()
		t.Logf("%d simulated nodes, their ResourceSlices and Leases created in %.1fs", len(simulated), time.Since(simStart).Seconds())
		sims.renewLeases(agentCtx, fleet, simulated)
	}
	if withBreaker {
		waitBreakerCount(t, admin, nodes*gpusPerNode)
	}

	before, writesBefore, cpuBefore, bytesBefore := counter.snapshot(), fleetWrites(t, fleet), processCPU(t), counter.bytes()
	time.Sleep(steady)
	after, writesAfter, cpuAfter, bytesAfter := counter.snapshot(), fleetWrites(t, fleet), processCPU(t), counter.bytes()
	fig.SteadyByKind = diff(after, before)
	fig.SteadyRequests = total(fig.SteadyByKind)
	fig.SteadyPerSecond = float64(fig.SteadyRequests) / steady.Seconds()
	fig.SteadyBytesPerSecond = float64(bytesAfter-bytesBefore) / steady.Seconds()
	cp := controlPlaneMemory(t, c)
	fig.APIServerRSSMiB, fig.EtcdRSSMiB = cp["kube-apiserver"][0], cp["etcd"][0]
	fig.SteadyWrites = sumWrites(writesAfter) - sumWrites(writesBefore)
	fig.SteadyCPUPercent = 100 * (cpuAfter - cpuBefore).Seconds() / steady.Seconds()
	fig.OpenWatches = counter.openWatches.Load()
	fig.WatchesPerNode = float64(fig.OpenWatches) / float64(nodes)
	fig.Transports = counter.transports.Load()

	faults, templates := singleFaults(t, admin, agentCfg, fleet, faultCount, &fig)
	wave(t, admin, fleet, counter, sims, faults, templates, &fig)
	if os.Getenv("GPUHEALTH_FLEET_BARE") != "0" {
		bareWave(t, admin, agentCfg, fleet, &fig)
	}
	if fig.Readers {
		measureReaders(t, c, adminCfg, fleet, &fig)
	}
	cp = controlPlaneMemory(t, c)
	fig.APIServerPeakRSSMiB, fig.EtcdPeakRSSMiB = cp["kube-apiserver"][1], cp["etcd"][1]

	stop()
	if heartbeat > 0 {
		heartbeatPhase(t, admin, agentNodes, counter, agentSettings, heartbeat, heartbeatWindow, &fig)
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
	// simulated: no agent runs for this node; it is written as one would write it, and lease is
	// its heartbeat Lease as the last renewal returned it (simulated_test.go).
	simulated bool
	lease     *coordinationv1.Lease
	name      string
	labels    map[string]string // besides controlplane.Node's: a rack, a driver (labelFleet)
	uuids     []string
	backend   *agenttest.Backend
	client    kube.Interface
	registry  *prometheus.Registry
	addr      atomic.Value // string: the agent's /readyz address once it listens
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

// installFlowControl creates the FlowSchema and priority level the chart installs for the agents
// and waits until the API server uses them.
func installFlowControl(t *testing.T, admin kubernetes.Interface, queueLength int) {
	t.Helper()
	ctx := t.Context()
	schema, level := agent.FlowControl(agentAccount, agentNamespace, agentAccount, int32(queueLength))
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
			node := fleetNodeObject(n.name)
			maps.Copy(node.Labels, n.labels)
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

// fleetNodeObject is node name as the test creates it: Ready, as a kubelet would report it, with
// the 8 GPUs NVIDIA's device plugin would advertise as capacity.
func fleetNodeObject(name string) *corev1.Node {
	node := controlplane.Node(name)
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}
	node.Status.Capacity = corev1.ResourceList{scheduling.ResourceGPU: *resource.NewQuantity(gpusPerNode, resource.DecimalSI)}
	return node
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
