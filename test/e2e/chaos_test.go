//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/simulate"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// expectedState replays a scenario on virtual time through the same library the agent runs and
// returns what the API server must show at its end: the Volcano ids and the UUIDs that need a
// DeviceTaintRule.
func expectedState(t *testing.T, node string, gpus int, body string) (ids string, ruled []string) {
	t.Helper()
	sc, err := sim.ParseScenario([]byte(fmt.Sprintf("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: %s\ngpus: {count: %d}\n%s", node, gpus, body)))
	if err != nil {
		t.Fatal(err)
	}
	res, err := simulate.Run(t.Context(), sc, health.DefaultPolicy(), simulate.Options{SampleInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var unhealthy []string
	for _, d := range res.Devices {
		if d.Health == "Unhealthy" {
			unhealthy = append(unhealthy, strconv.Itoa(d.Index))
		}
		if d.Health != "Healthy" {
			ruled = append(ruled, devicetaint.RuleName(node, d.UUID))
		}
	}
	slices.Sort(ruled)
	return strings.Join(unhealthy, ","), ruled
}

// converged waits until node's annotation and rules are exactly ids and ruled, and its
// GPUUnhealthy condition names the same GPUs: all three sinks have written the state, so an
// agent killed after converged has no write of it still in flight.
func converged(t *testing.T, c *controlplane.Cluster, node, ids string, ruled []string) {
	t.Helper()
	eventually(t, node+" converges to the expected state", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", nil // the API server may be coming back
		}
		rs, err := rules(ctx, c, node)
		if err != nil {
			return false, "", nil
		}
		cond, err := nodeCondition(ctx, c, node, corev1.NodeConditionType(gpuhealthv1.ConditionGPUUnhealthy))
		if err != nil {
			return false, "", nil
		}
		var names []string
		for n := range rs {
			names = append(names, n)
		}
		slices.Sort(names)
		condOK := conditionNames(cond, ids, len(ruled))
		return ann[gpuhealthv1.UnhealthyIDsKey] == ids && slices.Equal(names, ruled) && condOK,
			fmt.Sprintf("ids=%q (want %q) rules=%v (want %v) condition %s %q (agrees: %t)",
				ann[gpuhealthv1.UnhealthyIDsKey], ids, names, ruled, cond.Status, cond.Message, condOK), nil
	})
}

// conditionNames reports whether a GPUUnhealthy condition says what the sinks' state is: True
// naming exactly the GPU indexes in ids (a comma-separated list) when there are any, and ruled
// GPUs in all (unhealthy and degraded) counted.
func conditionNames(cond corev1.NodeCondition, ids string, ruled int) bool {
	if ids == "" {
		return cond.Status != corev1.ConditionTrue && (ruled == 0) == !strings.Contains(cond.Message, "GPUs degraded")
	}
	unhealthy := strings.Split(ids, ",")
	if cond.Status != corev1.ConditionTrue || !strings.HasPrefix(cond.Message, fmt.Sprintf("%d of ", len(unhealthy))) {
		return false
	}
	for _, id := range unhealthy {
		if !strings.Contains(cond.Message, " "+id+" (GPU-") {
			return false
		}
	}
	if degraded := ruled - len(unhealthy); degraded > 0 {
		return strings.Contains(cond.Message, fmt.Sprintf(". %d of ", degraded))
	}
	return !strings.Contains(cond.Message, "GPUs degraded")
}

// TestChaosAPIServerRestartDuringFaultWave takes kube-apiserver away while a wave of faults and
// repairs hits three nodes: every agent must converge to the state the scenario implies once the
// API server is back, with nothing lost.
func TestChaosAPIServerRestartDuringFaultWave(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	wave := `events:
  - {at: 2s, gpu: 1, xid: 79}
  - {at: 2s, gpu: 2, xid: 48}
  - {at: 3s, gpu: 4, temperatureC: 91}
  - {at: 4s, gpu: 2, reset: true}
  - {at: 4s, gpu: 6, remappedRows: {pending: true}}
  - {at: 5s, gpu: 7, xid: 13, repeat: 1000}
`
	nodes := []string{"chaos-wave-0", "chaos-wave-1", "chaos-wave-2"}
	for _, node := range nodes {
		gpuNode(t, c, node, 8)
	}
	kubeconfig := agentKubeconfig(t, c)
	for _, node := range nodes {
		startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), node+".ckpt"), scenario: wave})
	}
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(7 * time.Second) // the whole wave happens while the API server is away
	if err := c.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	ids, ruled := expectedState(t, nodes[0], 8, wave)
	for _, node := range nodes {
		_, nodeRuled := expectedState(t, node, 8, wave)
		converged(t, c, node, ids, nodeRuled)
	}
	if ids != "1" || len(ruled) != 3 {
		t.Errorf("expected state ids=%q rules=%v; want GPU 1 Unhealthy and three GPUs ruled (1, 4 Degraded, 6 Degraded)", ids, ruled)
	}
}

// TestChaosAgentKilledAtRandomPoints kills the agent with SIGKILL at random moments of a busy
// scenario and starts it again (with the same checkpoint), several times; the final state in the
// API server must be exactly what the scenario implies. The random seed is logged so that a
// failure can be replayed (GPUHEALTH_CHAOS_SEED).
func TestChaosAgentKilledAtRandomPoints(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "chaos-kill"
	gpuNode(t, c, node, 8)
	kubeconfig := agentKubeconfig(t, c)
	checkpoint := filepath.Join(t.TempDir(), "ckpt.json")
	busy := `events:
  - {at: 0s, gpu: 0, xid: 79}
  - {at: 1s, gpu: 1, xid: 48}
  - {at: 1s, gpu: 2, xid: 64}
  - {at: 2s, gpu: 3, ecc: {uncorrectedVolatile: 2}}
  - {at: 2s, gpu: 5, xid: 92}
  - {at: 3s, gpu: 1, reset: true}
  - {at: 3s, gpu: 4, recoveryAction: nodeReboot}
  - {at: 4s, gpu: 6, lost: true}
  - {at: 4s, gpu: 7, xid: 31, repeat: 5000}
`
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("GPUHEALTH_CHAOS_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("chaos seed %d (GPUHEALTH_CHAOS_SEED=%d replays it)", seed, seed)
	rnd := rand.New(rand.NewPCG(seed, seed))
	// Each start replays the scenario from its beginning, which to the GPUs' histories (kept in
	// the checkpoint) is GPU 1's XID 48 coming back after every reset: escalation would make it
	// ReplaceGPU. A real restart replays no faults, so escalation is off here; its own tests are
	// TestAgentJudgesHealthOverTime and pkg/health's.
	const noEscalation = "escalation: {enabled: false}\n"
	for range 4 {
		a := startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: kubeconfig, checkpoint: checkpoint, scenario: busy, topConfig: noEscalation})
		time.Sleep(time.Duration(rnd.IntN(5000)) * time.Millisecond)
		a.kill()
	}
	startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: kubeconfig, checkpoint: checkpoint, scenario: busy, topConfig: noEscalation})
	ids, ruled := expectedState(t, node, 8, busy)
	converged(t, c, node, ids, ruled)
}

// TestChaosMillionSignalStorm sends a million identical XIDs (and a million application XIDs on
// another GPU): the agent's memory stays bounded, the final state is right, and each sink writes
// once for the one state change.
func TestChaosMillionSignalStorm(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "chaos-storm"
	gpuNode(t, c, node, 8)
	storm := "events:\n  - {at: 2s, gpu: 3, xid: 79, repeat: 1000000}\n  - {at: 2s, gpu: 4, xid: 13, repeat: 1000000}\n"
	a := startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), scenario: storm})
	base := a.writes()
	ids, ruled := expectedState(t, node, 8, storm)
	converged(t, c, node, ids, ruled)
	eventually(t, "both million-signal bursts processed", func(context.Context) (bool, string, error) {
		body, err := httpGet(a.metrics + "/metrics")
		if err != nil {
			return false, "", nil
		}
		return strings.Contains(body, `xid="79"} 1e+06`) && strings.Contains(body, `xid="13"} 1e+06`), "waiting for 2e6 XIDs", nil
	})
	got := a.writes()
	for _, sink := range []string{"annotation", "devicetaint", "condition"} {
		if d := got[sink] - base[sink]; d != 1 {
			t.Errorf("%s: %d writes for one state change, want 1", sink, d)
		}
	}
	rss := a.rssBytes()
	t.Logf("agent RSS after 2,000,000 signals: %.1f MiB", float64(rss)/(1<<20))
	if rss > 256<<20 {
		t.Errorf("agent RSS %d MiB after the storm; memory must not grow with a storm", rss>>20)
	}
}

// rssBytes reads the agent process's resident set size from /proc.
func (a *agentProcess) rssBytes() int64 {
	a.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
	if err != nil {
		a.t.Fatalf("read the agent's /proc status: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				a.t.Fatalf("VmRSS %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	a.t.Fatal("no VmRSS in the agent's /proc status")
	return 0
}

// TestChaosCorruptCheckpoint truncates, then bit-flips, the agent's checkpoint while it is down:
// the agent reports the bad file (a CheckpointIgnored Event), does not trust it, and still loses
// no fault: it rebuilds the sticky ones from what it reported on its Node during this boot, so
// the API server keeps exactly the state it had, without a single write.
func TestChaosCorruptCheckpoint(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "chaos-checkpoint"
	gpuNode(t, c, node, 8)
	kubeconfig := agentKubeconfig(t, c)
	checkpoint := filepath.Join(t.TempDir(), "ckpt.json")
	faults := "events:\n  - {at: 0s, gpu: 2, xid: 79}\n  - {at: 1s, gpu: 5, xid: 48}\n"
	ids, ruled := expectedState(t, node, 8, faults)
	a := startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: kubeconfig, checkpoint: checkpoint, scenario: faults})
	converged(t, c, node, ids, ruled)
	a.kill()

	for _, corrupt := range []struct {
		name string
		do   func(b []byte) []byte
	}{
		{"truncated", func(b []byte) []byte { return b[:len(b)/2] }},
		{"bit flipped", func(b []byte) []byte {
			i := strings.LastIndex(string(b), "XID") // inside the checksummed data
			b[i] ^= 0x01
			return b
		}},
	} {
		t.Run(corrupt.name, func(t *testing.T) {
			b, err := os.ReadFile(checkpoint)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(checkpoint, corrupt.do(b), 0o644); err != nil {
				t.Fatal(err)
			}
			a := startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: kubeconfig, checkpoint: checkpoint, scenario: "events: []\n"})
			converged(t, c, node, ids, ruled)
			if w := a.writes(); w["annotation"]+w["devicetaint"]+w["condition"] != 0 {
				t.Errorf("the agent wrote %v after a corrupt checkpoint; want nothing (no fault lost, none invented)", w)
			}
			eventually(t, "a CheckpointIgnored event", func(ctx context.Context) (bool, string, error) {
				evs, err := c.Admin().CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=CheckpointIgnored"})
				if err != nil {
					return false, "", err
				}
				return len(evs.Items) > 0, fmt.Sprint(len(evs.Items)), nil
			})
			a.kill()
		})
	}
}
