package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

// measureContainer runs TestBenchAgentContainerMemory o.Runs times: the agent as the chart's
// DaemonSet runs it, in a container on a real kubelet node with containerd, idle and under the
// storm, measured by the kubelet, its cgroup and /proc. It needs the containerd build
// (GPUHEALTH_CONTAINERD_BIN, as `make bench` sets) and the image (built by make when stale).
func measureContainer(ctx context.Context, o options) ([]figure.Figure, error) {
	progress("agent container: %d runs × (idle, storm of %d XIDs/s) × %s on a containerd node (TestBenchAgentContainerMemory)", o.Runs, o.StormRate, o.AgentWindow)
	if os.Getenv("GPUHEALTH_CONTAINERD_BIN") == "" {
		return nil, fmt.Errorf("GPUHEALTH_CONTAINERD_BIN is not set (make bench sets it; or -skip %s)", partContainer)
	}
	var figs []figure.Figure
	for r := range o.Runs {
		run := strconv.Itoa(r + 1)
		got, err := runTest(ctx, o, "TestBenchAgentContainerMemory", "./test/e2e/", "GPUHEALTH_BENCH_OUT", "container-"+run, partContainer, run,
			"GPUHEALTH_BENCH_WINDOW="+time.Duration(o.AgentWindow).String(), "GPUHEALTH_BENCH_STORM_RATE="+strconv.Itoa(o.StormRate))
		if err != nil {
			return nil, err
		}
		l := &lookup{figs: got}
		progress("  run %s: idle working set %.1f MiB, /proc RSS %.1f MiB; storm working set %.1f MiB", run,
			l.median(partContainer, figure.ContainerWorkingSet, figure.UnitKiB, figure.LabelScenario, figure.ScenarioIdle)/1024,
			l.median(partContainer, figure.ContainerProcRSS, figure.UnitKiB, figure.LabelScenario, figure.ScenarioIdle)/1024,
			l.median(partContainer, figure.ContainerWorkingSet, figure.UnitKiB, figure.LabelScenario, figure.ScenarioStorm)/1024)
		if l.err != nil {
			return nil, l.err
		}
		figs = append(figs, got...)
	}
	return figs, nil
}
