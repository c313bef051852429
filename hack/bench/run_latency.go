package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

// measureLatency runs TestBenchSignalToObject o.Runs times and returns each run's figures.
func measureLatency(ctx context.Context, o options) ([]figure.Figure, error) {
	progress("signal -> object latency: %d runs × %d faults and recoveries (TestBenchSignalToObject)", o.Runs, o.Faults)
	var figs []figure.Figure
	for r := range o.Runs {
		run := strconv.Itoa(r + 1)
		// The claimstatus reporter writes nothing here (the test makes no ResourceClaims), and the
		// test expects one write per change of every sink but the condition, so it is left out.
		got, err := runTest(ctx, o, "TestBenchSignalToObject", "./test/e2e/", "GPUHEALTH_BENCH_OUT", "latency-"+run, partLatency, run,
			"GPUHEALTH_BENCH_FAULTS="+strconv.Itoa(o.Faults), "GPUHEALTH_BENCH_REPORTERS=annotation,devicetaint,condition")
		if err != nil {
			return nil, err
		}
		var p50s []string
		for _, f := range got {
			if f.Name == figure.SignalToObject {
				p50s = append(p50s, fmt.Sprintf("%s p50 %.1fms;", f.Labels[figure.LabelPath], f.Percentiles[figure.P50]))
			}
		}
		progress("  run %s: %s", run, strings.Join(p50s, " "))
		figs = append(figs, got...)
	}
	return figs, nil
}
