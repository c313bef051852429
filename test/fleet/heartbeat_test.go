//go:build e2e

package fleet

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// heartbeatPhase measures what the heartbeat costs at steady state (issue 28: at most one write
// per node per period). The main run's agents keep the default period, 5 minutes, longer than
// its steady window and its wave (they write their first heartbeat with their start-up
// condition write, so none falls in those). Once they are stopped, every node's agent is
// started again with agent.heartbeat = period, the same client, backend and settings otherwise,
// and a fresh registry (each agent.Run registers its metrics); once all are ready and settled,
// the agents' requests (by kind) and writes (gpuhealth_api_writes_total) are counted over window.
//
// Where the window lies. A node's agent writes a heartbeat with its start-up reconcile (the main
// run's heartbeats are removed first, so one is due at every start), then one every T = period +
// Late, Late its agent's random 1s..1s+period/4. A start-up write in the window would count as a
// heartbeat, so the window opens only once every agent is ready (its start-up writes are done),
// every Node carries a heartbeat of this phase, and heartbeatSettle has passed.
//
// Why the agents start one after another. Over a window a node writes ⌊window/T⌋ or ⌈window/T⌉
// times, depending on where its heartbeats fall; the count averages window/T only when the
// nodes' phases are spread evenly over a period, as in a real fleet, whose nodes started at
// unrelated times. Agents started together have nearly one phase, so nearly every node writes
// the same number of times: over 3 periods, with T a little longer than the period, twice or
// three times depending on where the window opens, and the ratio reads 0.67 or 1.0 where it is
// about 0.93 (200 agents started together read 0.99: all 200 wrote 3 times). A longer window
// shrinks that error (up to one write per node per window) without removing it. So the agents
// start evenly over one mean T, period + period/8 + 1s, which spreads their phases over the
// period; the window, at least 2 periods, then holds every node's heartbeat at least once, and
// the one write per node that its phase decides averages out over the nodes.
//
// Writes per node per period = writes / nodes / (window / period): below 1 by the Late, which
// averages 1 s + period/8 (about 0.88), less the half second the heartbeat's precision loses.
// The test checks that the window holds no other write than the heartbeat's one patch and that
// no node wrote more than once per period; the ratio is reported, never asserted.
func heartbeatPhase(t *testing.T, admin kubernetes.Interface, fleet []*fleetNode, counter *requestCounter, settings config.AgentConfig, period, window time.Duration, fig *Figures) {
	t.Helper()
	// The agent's choice (internal/agent newWriters): the condition reporter carries the
	// heartbeat in its nodes/status patch, else the annotation reporter in its Node patch.
	owner, wantKind := config.ReporterCondition, "PATCH nodes/status"
	if !slices.Contains(settings.Reporters, owner) {
		owner, wantKind = config.ReporterAnnotation, "PATCH nodes"
	}
	if !slices.Contains(settings.Reporters, owner) {
		t.Logf("heartbeat phase skipped: no reporter of %v carries the heartbeat", settings.Reporters)
		return
	}
	fig.HeartbeatPeriodSeconds = period.Seconds()
	if err := clearHeartbeats(t.Context(), admin, fleet); err != nil {
		t.Fatal(err)
	}

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
	spread := period + period/8 + time.Second // the mean T: Late averages 1s + period/8
	start := time.Now()
	for i, n := range fleet {
		time.Sleep(time.Until(start.Add(spread * time.Duration(i) / time.Duration(len(fleet)))))
		agents.Go(func() error { return runAgent(ctx, n, settings) })
	}
	if err := waitReady(t.Context(), fleet); err != nil {
		t.Fatal(err)
	}
	t.Logf("heartbeat phase: %d agents started over %.1fs, all ready after %.1fs", len(fleet), spread.Seconds(), time.Since(start).Seconds())
	if err := waitHeartbeats(t.Context(), admin, len(fleet)); err != nil {
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
	perNode := map[int]int{} // writes in the window -> nodes
	// Writes at least a period apart: at most one more than the periods the window holds.
	most := int(math.Floor(measured.Seconds()/period.Seconds())) + 1
	for i, n := range fleet {
		sum := 0
		for reporter, v := range writesAfter[i] {
			d := v - writesBefore[i][reporter]
			fig.HeartbeatWrites[reporter] += d
			sum += d
		}
		perNode[sum]++
		if sum > most {
			t.Errorf("node %s: %d writes in %v, more than one per heartbeat period of %v", n.name, sum, measured.Round(time.Millisecond), period)
		}
	}
	maps.DeleteFunc(fig.HeartbeatWrites, func(_ string, v int) bool { return v == 0 })
	fig.HeartbeatPerNodePerPeriod = float64(sumWrites(fig.HeartbeatWrites)) / float64(len(fleet)) / (measured.Seconds() / period.Seconds())
	t.Logf("heartbeat phase: %s window, writes per node in it %v, by reporter %v; requests %s",
		measured.Round(time.Millisecond), perNode, fig.HeartbeatWrites, kinds(fig.HeartbeatByKind))

	for reporter, v := range fig.HeartbeatWrites {
		if reporter != owner {
			t.Errorf("heartbeat window: %d writes of reporter %s; want only the heartbeat's, of %s", v, reporter, owner)
		}
	}
	for kind, v := range fig.HeartbeatByKind {
		if kind != wantKind && !isRead(kind) && !strings.HasPrefix(kind, "failed ") {
			t.Errorf("heartbeat window: %d requests %s; want no write but the heartbeat's %s", v, kind, wantKind)
		}
	}
}

// isRead reports whether a request kind of requestKind reads.
func isRead(kind string) bool {
	verb, _, _ := strings.Cut(kind, " ")
	return verb == "GET" || verb == "LIST" || verb == "WATCH"
}

// clearHeartbeats removes the heartbeat annotation from every Node, so that every agent started
// next writes its first heartbeat at start-up, whatever the period and however old the last one.
func clearHeartbeats(ctx context.Context, admin kubernetes.Interface, fleet []*fleetNode) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null}}}`, gpuhealthv1.HeartbeatKey)
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, n := range fleet {
		g.Go(func() error {
			if _, err := admin.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("clear the heartbeat of %s: %w", n.name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// waitHeartbeats waits until the API server holds nodes Nodes, each with a heartbeat annotation
// (clearHeartbeats removed every one before the phase's agents started).
func waitHeartbeats(ctx context.Context, admin kubernetes.Interface, nodes int) error {
	deadline := time.Now().Add(convergeLimit)
	for {
		list, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		without := 0
		for _, n := range list.Items {
			if n.Annotations[gpuhealthv1.HeartbeatKey] == "" {
				without++
			}
		}
		if len(list.Items) == nodes && without == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v, %d of %d Nodes have no heartbeat", convergeLimit, without, len(list.Items))
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
