package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

// measureFleet runs test/fleet o.FleetRuns times with o.FleetNodes nodes (part fleet), then once
// with o.FleetLarge nodes (part fleet-large) and once with the circuit breaker on, its budget half
// the wave (part fleet-breaker), and returns every run's figures. Only the larger run measures
// the heartbeat (its phase takes minutes, and issue 28 asks for the cost at 5,000 nodes).
func measureFleet(ctx context.Context, o options) ([]figure.Figure, error) {
	progress("fleet: %d runs × %d nodes × 8 GPUs (test/fleet), then one run × %d nodes", o.FleetRuns, o.FleetNodes, o.FleetLarge)
	const noHeartbeat = "GPUHEALTH_FLEET_HEARTBEAT=0"
	var figs []figure.Figure
	for r := range o.FleetRuns {
		f, err := fleetRun(ctx, o, o.FleetNodes, partFleet, strconv.Itoa(r+1), noHeartbeat)
		if err != nil {
			return nil, err
		}
		figs = append(figs, f...)
	}
	if o.FleetLarge > 0 {
		// A 60 s heartbeat: at 20 s the 5,000 restarted agents' heartbeats (250 writes/s) and
		// their start-up together kept a tenth of them from getting ready on 2 cores within
		// the test's 5 minutes. The ratio per period does not depend on the period.
		f, err := fleetRun(ctx, o, o.FleetLarge, partFleetLarge, "1", "GPUHEALTH_FLEET_HEARTBEAT=60s")
		if err != nil {
			return nil, err
		}
		figs = append(figs, f...)
	}
	if o.FleetBreaker {
		f, err := fleetRun(ctx, o, o.FleetNodes, partFleetBreaker, "1", "GPUHEALTH_FLEET_BREAKER=1", "GPUHEALTH_FLEET_BREAKER_FRACTION=0.05", noHeartbeat)
		if err != nil {
			return nil, err
		}
		figs = append(figs, f...)
	}
	return figs, nil
}

// fleetRun runs test/fleet once with nodes nodes (and env added) and returns its figures as part
// and run.
func fleetRun(ctx context.Context, o options, nodes int, part, run string, env ...string) ([]figure.Figure, error) {
	name := part + "-" + run
	env = append([]string{"GPUHEALTH_FLEET=1", "GPUHEALTH_FLEET_NODES=" + strconv.Itoa(nodes), "GPUHEALTH_FLEET_STEADY=" + o.FleetSteady.String()}, env...)
	figs, err := runTest(ctx, o, "TestFleet", "./test/fleet/", "GPUHEALTH_FLEET_OUT", name, part, run, env...)
	if err != nil {
		return nil, err
	}
	l := &lookup{figs: figs}
	out := name + ".jsonl"
	progress("  %s: %.0f nodes ready in %.1fs, %.2f requests/s steady, wave in %.2fs", name,
		l.median(part, figure.FleetNodes, figure.UnitNodes), l.median(part, figure.FleetStartupTime, figure.UnitSeconds),
		l.median(part, figure.FleetSteadyRequestRate, figure.UnitRequestsPerSecond), l.median(part, figure.FleetWaveAllTime, figure.UnitSeconds))
	if l.hasFigure(part, figure.FleetHeartbeatPerNodePerPeriod) {
		progress("  %s: heartbeat %.2f writes per node per period", name,
			l.median(part, figure.FleetHeartbeatPerNodePerPeriod, figure.UnitWritesPerNodePerPeriod))
	}
	if l.err != nil {
		return nil, fmt.Errorf("%s: %w", out, l.err)
	}
	return figs, nil
}
