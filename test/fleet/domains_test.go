//go:build e2e

package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/breaker/controller"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

const (
	// rackFraction is each rack's budget: 16 of its 160 GPUs; clusterFraction the cluster's
	// (800 of 4,000 at 500 nodes), far above the wave, so that only the rack's budget holds.
	rackFraction    = 0.1
	clusterFraction = 0.2
	breakerWindow   = 10 * time.Minute
	// badRack is the rack that loses badRackGPUs GPUs on each of its nodes at once (80).
	badRack     = 7
	badRackGPUs = 4
	// domainLimit bounds each wait of the domain test: the wave settles in seconds.
	domainLimit = 3 * time.Minute
)

// TestFleetBreakerDomain: GPUHEALTH_FLEET_NODES (at least 500) nodes × 8 GPUs in racks of 20
// (example.com/rack), each with its own real agent (agent.Run, its own client) configured with
// circuitBreaker.domains [{label: example.com/rack, maxFraction: 0.1}] (and the cluster's 0.2),
// and the breaker controller (controller.Run, Domains the same) counting the cluster's and each
// rack's GPUs. At once, rack r07 loses 4 GPUs on each of its 20 nodes (80, XID 48) and every
// other full rack 2 GPUs: rack r07 is held at its budget (16 NoSchedule, 64 None; never more than
// 16 at once, its domain slots 16), every other rack's faults are admitted, the held nodes'
// GPUCircuitBreakerOpen condition names the rack, and the controller reports one
// CircuitBreakerDomainFull Event and one gpuhealth_breaker_domain_full series, for r07 alone.
func TestFleetBreakerDomain(t *testing.T) {
	size := judgedFleetSize(t)
	c, admin := quietCluster(t)
	ctx := t.Context()
	agentCfg := agentConfig(t, c, admin, true)
	installFlowControl(t, admin, agent.DefaultFlowQueueLength)
	fleet := makeFleet(size)
	labelFleet(fleet)
	start := time.Now()
	if err := createNodes(ctx, admin, fleet); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes and ResourceSlices created in %.1fs", size, time.Since(start).Seconds())
	metrics := startBreakerController(t, admin)
	counter := newRequestCounter()
	start = time.Now()
	startAgents(t, agentCfg, counter, fleet, config.AgentConfig{
		CheckpointPath: "-", Resync: ptrDuration(time.Hour), Heartbeat: ptrDuration(time.Hour),
		CircuitBreaker: config.CircuitBreakerConfig{Enabled: true, MaxFraction: clusterFraction, Window: ptrDuration(breakerWindow), Namespace: agentNamespace,
			Domains: []config.BreakerDomain{{Label: rackLabel, MaxFraction: rackFraction}}},
	})
	t.Logf("%d agents ready in %.1fs", size, time.Since(start).Seconds())
	waitBreakerCount(t, admin, size*gpusPerNode)
	waitDomainCount(t, admin, fleet)

	failing := domainWave(fleet)
	rackOfRule := map[string]string{}
	badGPUs := 0
	for n, gpus := range failing {
		for _, g := range gpus {
			rackOfRule[devicetaint.RuleName(n.name, n.uuids[g])] = n.labels[rackLabel]
			if n.labels[rackLabel] == rackOf(badRack*rackNodes) {
				badGPUs++
			}
		}
	}
	budget := breaker.Budget(rackFraction, rackNodes*gpusPerNode)
	_, rules := observeNodesAndRules(admin)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if existing, err := rules.start(watchCtx); err != nil || len(existing) != 0 {
		t.Fatalf("DeviceTaintRules before the wave: %d, %v", len(existing), err)
	}
	before := counter.snapshot()
	injected := time.Now()
	for n, gpus := range failing {
		for _, g := range gpus {
			n.backend.Signals <- health.Signal{Kind: health.SignalXID, Device: n.uuids[g], XID: waveXID, Time: injected}
		}
	}
	effects := awaitDomainWave(t, rules, rackOfRule, rackOf(badRack*rackNodes), budget, badGPUs)
	settled := time.Since(injected)
	stopWatch()
	t.Logf("wave: %d GPUs failed (%d in rack %s, budget %d; %d in %d other racks); settled in %.2fs: %s; requests until then: %s",
		len(rackOfRule), badGPUs, rackOf(badRack*rackNodes), budget, len(rackOfRule)-badGPUs, len(effects)-1, settled.Seconds(), effectsByRack(effects), kinds(diff(counter.snapshot(), before)))
	checkDomainRules(t, admin, rackOfRule, rackOf(badRack*rackNodes), budget, badGPUs)
	checkDomainSlots(t, admin, rackOf(badRack*rackNodes), budget)
	checkHeldNodes(t, admin, size, rackOf(badRack*rackNodes))
	checkDomainFinding(t, admin, metrics, rackOf(badRack*rackNodes), injected)
}

// startBreakerController runs the breaker controller (no leader election: it is alone) with the
// rack's domain until the test ends, and returns its metrics address.
func startBreakerController(t *testing.T, admin kubernetes.Interface) string {
	t.Helper()
	ctx, stop := context.WithCancel(klog.NewContext(t.Context(), logr.Discard()))
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- controller.Run(ctx, controller.Options{
			Client: admin, Namespace: agentNamespace, Window: breakerWindow,
			Domains:        []breaker.Domain{{Label: rackLabel, MaxFraction: rackFraction}},
			MetricsAddress: "127.0.0.1:0", Ready: func(a string) { addr <- a },
		})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("breaker controller: %v", err)
		}
	})
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("breaker controller: %v", err)
	case <-time.After(domainLimit):
		t.Fatal("the breaker controller did not listen")
	}
	return ""
}

// startAgents runs every node's agent with settings, each with its own client and connection
// (as TestFleet does), until the test ends, and waits until all are ready.
func startAgents(t *testing.T, agentCfg *rest.Config, counter *requestCounter, fleet []*fleetNode, settings config.AgentConfig) {
	t.Helper()
	ctx, stop := context.WithCancel(klog.NewContext(t.Context(), logr.Discard()))
	var agents errgroup.Group
	t.Cleanup(func() {
		stop()
		if err := agents.Wait(); err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	for _, n := range fleet {
		cfg := rest.CopyConfig(agentCfg)
		cfg.QPS, cfg.Burst = agent.ClientQPS, agent.ClientBurst
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil } // a transport of its own
		cfg.WrapTransport = counter.wrap
		client, err := kube.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n.client = client
		agents.Go(func() error { return runAgent(ctx, n, settings) })
	}
	if err := waitReady(t.Context(), fleet); err != nil {
		t.Fatal(err)
	}
}

// waitDomainCount waits until the breaker's ConfigMap counts every rack's GPUs.
func waitDomainCount(t *testing.T, admin kubernetes.Interface, fleet []*fleetNode) {
	t.Helper()
	want := map[string]int{}
	for _, n := range fleet {
		want[n.labels[rackLabel]] += gpusPerNode
	}
	deadline := time.Now().Add(domainLimit)
	for {
		cm, err := admin.CoreV1().ConfigMaps(agentNamespace).Get(t.Context(), breaker.ConfigMapName, metav1.GetOptions{})
		if err == nil && fmt.Sprint(breaker.ParseDomainGPUs(cm)[rackLabel]) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the breaker's ConfigMap never counted the racks %v: %v, %v", want, cm, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// domainWave returns the wave's failing GPUs by node: GPUs 0 to 3 of every node of rack badRack,
// and in every other full rack GPU r%8 of its 6th and its 16th node.
func domainWave(fleet []*fleetNode) map[*fleetNode][]int {
	failing := map[*fleetNode][]int{}
	for r := 0; (r+1)*rackNodes <= len(fleet); r++ {
		if r == badRack {
			for _, n := range fleet[r*rackNodes : (r+1)*rackNodes] {
				for g := range badRackGPUs {
					failing[n] = append(failing[n], g)
				}
			}
			continue
		}
		for _, i := range []int{5, 15} {
			failing[fleet[r*rackNodes+i]] = []int{r % gpusPerNode}
		}
	}
	return failing
}

// awaitDomainWave follows the wave's DeviceTaintRules until every failing GPU has one, the bad
// rack has exactly budget NoSchedule (and the rest None) and every other rack's are NoSchedule;
// it fails as soon as the bad rack has more than budget disruptive rules at once. It returns the
// effects seen, by rack.
func awaitDomainWave(t *testing.T, rules *observed, rackOfRule map[string]string, bad string, budget, badGPUs int) map[string]map[resourcev1.DeviceTaintEffect]int {
	t.Helper()
	seen := map[string]resourcev1.DeviceTaintEffect{}
	deadline := time.After(domainLimit)
	for {
		byRack := map[string]map[resourcev1.DeviceTaintEffect]int{}
		for name, e := range seen {
			if byRack[rackOfRule[name]] == nil {
				byRack[rackOfRule[name]] = map[resourcev1.DeviceTaintEffect]int{}
			}
			byRack[rackOfRule[name]][e]++
		}
		held := byRack[bad]
		if disruptive := held[resourcev1.DeviceTaintEffectNoSchedule] + held[resourcev1.DeviceTaintEffectNoExecute]; disruptive > budget {
			t.Fatalf("rack %s has %d disruptive rules at once, past its budget of %d: %s", bad, disruptive, budget, effectsByRack(byRack))
		}
		admitted := 0
		for rack, e := range byRack {
			if rack != bad {
				admitted += e[resourcev1.DeviceTaintEffectNoSchedule]
			}
		}
		if len(seen) == len(rackOfRule) && held[resourcev1.DeviceTaintEffectNoSchedule] == budget &&
			held[resourcev1.DeviceTaintEffectNone] == badGPUs-budget && admitted == len(rackOfRule)-badGPUs {
			return byRack
		}
		select {
		case obj := <-rules.objects:
			if r, ok := obj.(*resourcev1.DeviceTaintRule); ok && rackOfRule[r.Name] != "" {
				seen[r.Name] = r.Spec.Taint.Effect
			}
		case err := <-rules.errs:
			t.Fatal(err)
		case <-deadline:
			t.Fatalf("after %v: %d of %d rules, by rack %s; want %s held at %d", domainLimit, len(seen), len(rackOfRule), effectsByRack(byRack), bad, budget)
		}
	}
}

// effectsByRack is the rules' effects by rack, the racks that only had NoSchedule summed up.
func effectsByRack(byRack map[string]map[resourcev1.DeviceTaintEffect]int) string {
	var parts []string
	admitted, racks := 0, 0
	for rack, e := range byRack {
		if len(e) == 1 && e[resourcev1.DeviceTaintEffectNoSchedule] > 0 {
			admitted += e[resourcev1.DeviceTaintEffectNoSchedule]
			racks++
			continue
		}
		parts = append(parts, fmt.Sprintf("rack %s %v", rack, e))
	}
	return strings.Join(append(parts, fmt.Sprintf("%d racks all NoSchedule (%d rules)", racks, admitted)), ", ")
}

// httpGet returns the body of url.
func httpGet(ctx context.Context, u string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
