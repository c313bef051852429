//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/nvsentineltest"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// nvsentinelCoolsAt is when GPU 1's temperature falls back: long enough after GPU 5's reset (20s)
// for the test to have stopped the platform-connector first, on a slow machine too.
const nvsentinelCoolsAt = 45 * time.Second

// TestNVSentinel runs the real agent with the nvsentinel reporter against a platform-connector
// of gpuhealth's own (from NVSentinel's interface) on a Unix socket: nothing is lost while the
// socket is absent; XID 79 on GPU 3 and a DBE on GPU 5 arrive as exactly the events NVSentinel's
// rules read, and a Degraded GPU 1 only as non-fatal; GPU 5's reset sends its healthy twin, with
// the same entities, and GPU 3 stays faulted; a platform-connector killed and started again gets
// the whole state again, with the twin of what ended while it was away.
func TestNVSentinel(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "nvsentinel-node"
	uuids := gpuNode(t, c, node, 8)
	socket := filepath.Join(t.TempDir(), "nvsentinel.sock")
	started := time.Now()
	agent := startAgent(t, agentSetup{
		node: node, gpus: 8, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: "events:\n" +
			"  - {at: 1s, gpu: 3, xid: 79}\n" +
			"  - {at: 1s, gpu: 5, ecc: {uncorrectedVolatile: 1}}\n" +
			"  - {at: 1s, gpu: 1, temperatureC: 92}\n" +
			"  - {at: 20s, gpu: 5, reset: true}\n" +
			fmt.Sprintf("  - {at: %s, gpu: 1, temperatureC: 60}\n", nvsentinelCoolsAt),
		agentConfig: fmt.Sprintf("  reporters: [annotation, devicetaint, condition, claimstatus, nvsentinel]\n  nvsentinel: {socket: %s, rebootAction: RESTART_BM}\n", socket),
	})
	gpuHealth := func(want map[int]string) func(ctx context.Context) (bool, string, error) {
		return func(ctx context.Context) (bool, string, error) {
			ann, err := nodeAnnotations(ctx, c, node)
			if err != nil {
				return false, "", err
			}
			summaries, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
			if err != nil {
				return false, "", err
			}
			ok, state := true, ""
			for i, h := range want {
				ok = ok && summaries[uuids[i]].Health == h
				state += fmt.Sprintf("GPU %d %s %v; ", i, summaries[uuids[i]].Health, summaries[uuids[i]].Reasons)
			}
			return ok, state, nil
		}
	}
	eventually(t, "the agent judges GPUs 3, 5 and 1", gpuHealth(map[int]string{3: "Unhealthy", 5: "Unhealthy", 1: "Degraded"}))

	gpu := func(i int) string {
		return fmt.Sprintf("[GPU:%d PCI:0000:%x:00 GPU_UUID:%s]", i, 0x10+i, uuids[i])
	}
	xid79 := "fatal GpuHealthXID [79] " + gpu(3) + " RESTART_BM"
	dbe5 := "fatal GpuHealthMemory [ECCUncorrected] " + gpu(5) + " COMPONENT_RESET"
	warm1 := "non-fatal GpuHealthThermal [Thermal] " + gpu(1) + " NONE"
	// The clears at start: a check with a fault GPU by GPU, the others as a whole.
	want := []string{xid79, dbe5, warm1}
	faulty := map[string]int{nvsentinel.CheckXID: 3, nvsentinel.CheckMemory: 5, nvsentinel.CheckThermal: 1}
	for _, check := range nvsentinel.Checks() {
		f, scoped := faulty[check]
		if !scoped {
			want = append(want, "healthy "+check+" [] [] NONE")
			continue
		}
		for i := range 8 {
			if i != f {
				want = append(want, "healthy "+check+" [] "+gpu(i)+" NONE")
			}
		}
	}

	// The faults wait for NVSentinel, and a send of them found no socket.
	eventually(t, "everything pending", func(ctx context.Context) (bool, string, error) {
		pending, err := agent.seriesValue("gpuhealth_nvsentinel_pending_events")
		return pending == float64(len(want)) && err == nil, fmt.Sprintf("%v pending (%v)", pending, err), nil
	})
	unavailable, err := agent.seriesValue(`gpuhealth_nvsentinel_sends_total{node="nvsentinel-node",result="unavailable"}`)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "a send of the faults found no socket", agent.nvsentinelSends("unavailable", unavailable+1))
	srv := startPlatformConnector(t, socket)
	got := srv.receive(t, agent, "everything kept while the socket was absent", len(want))
	expectEvents(t, "the first delivery", got, want, node)

	eventuallyWithin(t, 20*time.Second+pollTimeout, "GPU 5 reset", gpuHealth(map[int]string{5: "Healthy", 3: "Unhealthy", 1: "Degraded"}))
	got = srv.receive(t, agent, "GPU 5's twin", len(want)+1)[len(want):]
	expectEvents(t, "GPU 5's recovery", got, []string{"healthy GpuHealthMemory [ECCUncorrected] " + gpu(5) + " NONE"}, node)

	srv.Stop() // killed: the socket file stays behind
	if since := time.Since(started); since >= nvsentinelCoolsAt {
		t.Fatalf("the platform-connector was stopped %v after the agent started, after GPU 1 cooled down (%v): the rest proves nothing", since, nvsentinelCoolsAt)
	}
	eventuallyWithin(t, nvsentinelCoolsAt+pollTimeout, "GPU 1 cools down while NVSentinel is away", gpuHealth(map[int]string{1: "Healthy", 3: "Unhealthy"}))
	eventually(t, "the agent's sends to the stopped server fail", agent.nvsentinelSends("error", 1))

	srv = startPlatformConnector(t, socket) // a new platform-connector, knowing nothing
	got = srv.receive(t, agent, "the state sent again", 2)
	expectEvents(t, "after the restart", got, []string{xid79, "healthy GpuHealthThermal [Thermal] " + gpu(1) + " NONE"}, node)
}

// platformConnector is nvsentineltest's server with what the test asks of it.
type platformConnector struct{ *nvsentineltest.Server }

func startPlatformConnector(t *testing.T, socket string) platformConnector {
	t.Helper()
	srv, err := nvsentineltest.Start(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return platformConnector{srv}
}

// receive waits until the server holds n events and the agent has nothing left to send, and
// returns what the server holds.
func (p platformConnector) receive(t *testing.T, a *agentProcess, what string, n int) []*datamodels.HealthEvent {
	t.Helper()
	var events []*datamodels.HealthEvent
	eventually(t, what, func(ctx context.Context) (bool, string, error) {
		events = p.Events()
		pending, err := a.seriesValue("gpuhealth_nvsentinel_pending_events")
		return len(events) >= n && pending == 0 && err == nil, fmt.Sprintf("%d events, %v pending (%v)", len(events), pending, err), nil
	})
	return events
}

// expectEvents checks that got is exactly want (in any order), and that every event carries
// what every gpuhealth event must.
func expectEvents(t *testing.T, what string, got []*datamodels.HealthEvent, want []string, node string) {
	t.Helper()
	var desc []string
	for _, ev := range got {
		desc = append(desc, nvsentineltest.Describe(ev))
		if ev.Version != 1 || ev.Agent != "gpuhealth" || ev.ComponentClass != "GPU" || ev.NodeName != node || ev.GeneratedTimestamp == nil ||
			ev.ProcessingStrategy != datamodels.ProcessingStrategy_EXECUTE_REMEDIATION || ev.Id != "" {
			t.Errorf("%s: %s: version %d, agent %q, class %q, node %q, time %v, strategy %v, id %q", what, nvsentineltest.Describe(ev),
				ev.Version, ev.Agent, ev.ComponentClass, ev.NodeName, ev.GeneratedTimestamp, ev.ProcessingStrategy, ev.Id)
		}
	}
	slices.Sort(desc)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(desc, want) {
		t.Fatalf("%s: received\n  %s\nwant\n  %s", what, strings.Join(desc, "\n  "), strings.Join(want, "\n  "))
	}
}

// nvsentinelSends waits for at least n sends with result.
func (a *agentProcess) nvsentinelSends(result string, n float64) func(ctx context.Context) (bool, string, error) {
	return func(ctx context.Context) (bool, string, error) {
		v, err := a.seriesValue(`gpuhealth_nvsentinel_sends_total{node="nvsentinel-node",result="` + result + `"}`)
		return v >= n && err == nil, fmt.Sprintf("%v %s sends (%v)", v, result, err), nil
	}
}

// seriesValue returns the value of the series named name (with its labels, as /metrics writes them;
// a name alone matches the first series of that name).
func (a *agentProcess) seriesValue(name string) (float64, error) {
	body, err := httpGet(a.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		series, value, ok := strings.Cut(sc.Text(), " ")
		if ok && (series == name || (!strings.Contains(name, "{") && strings.HasPrefix(series, name+"{"))) {
			return strconv.ParseFloat(value, 64)
		}
	}
	return 0, fmt.Errorf("no series %s", name)
}
