//go:build e2e

package fleet

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// heartbeatSettle is how long the heartbeat phase waits, once every agent is ready and every
// Node has its heartbeat, before its window opens: the start-up's stragglers (watches opening,
// the informer events of the start-up writes) settle, as before the main run's steady window.
const heartbeatSettle = 5 * time.Second

// heartbeatKnobs reads GPUHEALTH_FLEET_HEARTBEAT, the heartbeat phase's agent.heartbeat (default
// 20s, so that the phase fits in a bench run; at least config.MinHeartbeat; 0 skips the phase),
// and GPUHEALTH_FLEET_HEARTBEAT_WINDOW, its window (default 3 periods, at least 2: see
// heartbeatPhase).
func heartbeatKnobs(t *testing.T) (period, window time.Duration) {
	t.Helper()
	if os.Getenv("GPUHEALTH_FLEET_HEARTBEAT") == "0" {
		return 0, 0
	}
	period = envDuration(t, "GPUHEALTH_FLEET_HEARTBEAT", 20*time.Second)
	if period < config.MinHeartbeat {
		t.Fatalf("GPUHEALTH_FLEET_HEARTBEAT=%v: agent.heartbeat must be at least %v", period, config.MinHeartbeat)
	}
	window = envDuration(t, "GPUHEALTH_FLEET_HEARTBEAT_WINDOW", 3*period)
	if window < 2*period {
		t.Fatalf("GPUHEALTH_FLEET_HEARTBEAT_WINDOW=%v: want at least 2 heartbeat periods (%v)", window, 2*period)
	}
	return period, window
}

// heartbeatPhase measures what the heartbeat costs at steady state (issue 49: no Node write at
// all, one Lease renewal per node per period). The main run's agents renew their Leases an hour
// apart, so none falls in its steady window or its wave. Once they are stopped, every node's agent
// is started again with agent.heartbeat = period, the same client, backend and settings
// otherwise, and a fresh registry (each agent.Run registers its metrics); once all are ready and
// every node's Lease is renewed by them, the agents' requests (by kind) and Node writes
// (gpuhealth_api_writes_total) are counted over window.
//
// Why the agents start one after another. Over a window a node renews ⌊window/T⌋ or ⌈window/T⌉
// times (T = period + its random jitter, up to a quarter of a period), depending on where its
// renewals fall; the count averages window/T only when the nodes' phases are spread evenly over a
// period, as in a real fleet. So the agents start evenly over one mean T, period + period/8.
//
// Renewals per node per period = PUT leases / nodes / (window / period): below 1 by the jitter
// (about 0.89). The test checks that the window holds no Node write and no write but the
// renewals, and that no node renewed more than once per period; the ratio is reported, never
// asserted.
func heartbeatPhase(t *testing.T, admin kubernetes.Interface, fleet []*fleetNode, counter *requestCounter, settings config.AgentConfig, period, window time.Duration, fig *Figures) {
	t.Helper()
	const renewal = "PUT leases"
	fig.HeartbeatPeriodSeconds = period.Seconds()
	settings.Heartbeat = ptrDuration(period)
	ctx, stopAgents := context.WithCancel(klog.NewContext(t.Context(), logr.Discard()))
	var agents errgroup.Group
	defer func() {
		stopAgents()
		if err := agents.Wait(); err != nil {
			t.Errorf("agent (heartbeat phase): %v", err)
		}
	}()
	for _, n := range fleet {
		n.registry = prometheus.NewRegistry()
		n.addr.Store("")
	}
	spread := period + period/8 // the mean T
	start := time.Now()
	for i, n := range fleet {
		time.Sleep(time.Until(start.Add(spread * time.Duration(i) / time.Duration(len(fleet)))))
		agents.Go(func() error { return runAgent(ctx, n, settings) })
	}
	if err := waitReady(t.Context(), fleet); err != nil {
		t.Fatal(err)
	}
	t.Logf("heartbeat phase: %d agents started over %.1fs, all ready after %.1fs", len(fleet), spread.Seconds(), time.Since(start).Seconds())
	if err := waitRenewed(t.Context(), admin, fleet, start); err != nil {
		t.Fatal(err)
	}
	time.Sleep(heartbeatSettle)

	// Each node's registry is read at the same offset into both passes, so each node's count
	// covers the same span, from the first pass's start to the second's.
	opened := time.Now()
	before, writesBefore := counter.snapshot(), perNodeWrites(t, fleet)
	time.Sleep(window)
	closed := time.Now()
	after, writesAfter := counter.snapshot(), perNodeWrites(t, fleet)
	measured := closed.Sub(opened)

	fig.HeartbeatWindowSeconds = measured.Seconds()
	fig.HeartbeatByKind = diff(after, before)
	fig.HeartbeatRequests = total(fig.HeartbeatByKind)
	fig.HeartbeatWrites = map[string]int{}
	for i, n := range fleet {
		for reporter, v := range writesAfter[i] {
			if d := v - writesBefore[i][reporter]; d != 0 {
				fig.HeartbeatWrites[reporter] += d
				t.Errorf("node %s: reporter %s wrote the Node %d times in a window where nothing changed; want none (the heartbeat is the Lease)", n.name, reporter, d)
			}
		}
	}
	renewals := int(fig.HeartbeatByKind[renewal])
	fig.HeartbeatWrites["lease"] = renewals
	fig.HeartbeatPerNodePerPeriod = float64(renewals) / float64(len(fleet)) / (measured.Seconds() / period.Seconds())
	// Renewals at least a period apart: at most one more than the periods the window holds.
	if most := (int(math.Floor(measured.Seconds()/period.Seconds())) + 1) * len(fleet); renewals > most {
		t.Errorf("heartbeat window: %d Lease renewals in %v by %d nodes, more than one per node per period of %v", renewals, measured.Round(time.Millisecond), len(fleet), period)
	}
	t.Logf("heartbeat phase: %s window, %d renewals (%.2f per node per period); requests %s",
		measured.Round(time.Millisecond), renewals, fig.HeartbeatPerNodePerPeriod, kinds(fig.HeartbeatByKind))
	for kind, v := range fig.HeartbeatByKind {
		if kind != renewal && !isRead(kind) && !strings.HasPrefix(kind, "failed ") {
			t.Errorf("heartbeat window: %d requests %s; want no write but the heartbeat's %s", v, kind, renewal)
		}
	}
}

// isRead reports whether a request kind of requestKind reads.
func isRead(kind string) bool {
	verb, _, _ := strings.Cut(kind, " ")
	return verb == "GET" || verb == "LIST" || verb == "WATCH"
}

// waitRenewed waits until the heartbeat Lease of every node of fleet was renewed at or after
// since (by the phase's agents).
func waitRenewed(ctx context.Context, admin kubernetes.Interface, fleet []*fleetNode, since time.Time) error {
	deadline := time.Now().Add(convergeLimit)
	for {
		list, err := admin.CoordinationV1().Leases(agentNamespace).List(ctx, metav1.ListOptions{LabelSelector: gpuhealthv1.HeartbeatLeaseLabel + "=true"})
		if err != nil {
			return err
		}
		renewed := map[string]bool{}
		for _, l := range list.Items {
			if l.Spec.HolderIdentity != nil && l.Spec.RenewTime != nil && !l.Spec.RenewTime.Time.Before(since.Truncate(time.Second)) {
				renewed[*l.Spec.HolderIdentity] = true
			}
		}
		missing := 0
		for _, n := range fleet {
			if !renewed[n.name] {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v, %d of %d nodes' heartbeat Leases are not renewed", convergeLimit, missing, len(fleet))
		}
		time.Sleep(time.Second)
	}
}

// perNodeWrites is every node's agent's writes by reporter, in the order of fleet.
func perNodeWrites(t *testing.T, fleet []*fleetNode) []map[string]int {
	t.Helper()
	out := make([]map[string]int, len(fleet))
	for i, n := range fleet {
		out[i] = nodeWrites(t, n)
	}
	return out
}

// defaultHeartbeatRate is the fleet's heartbeat writes per second at the default period
// (config.DefaultHeartbeat) for nodes nodes writing perNode times per period. perNode measured
// at a shorter period is a little low for the default (the Late is a smaller share of a longer
// period); the rate never exceeds nodes per period.
func defaultHeartbeatRate(nodes int, perNode float64) float64 {
	return float64(nodes) / config.DefaultHeartbeat.Seconds() * perNode
}
