package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
		out := filepath.Join(o.Raw, "latency-"+run+".jsonl")
		_ = os.Remove(out)
		cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-tags", "e2e", "-run", "^TestBenchSignalToObject$", "-timeout", "20m", "./test/e2e/")
		// The claimstatus reporter writes nothing here (the test makes no ResourceClaims), and the
		// test expects one write per change of every sink but the condition, so it is left out.
		cmd.Env = append(os.Environ(), "GPUHEALTH_BENCH_FAULTS="+strconv.Itoa(o.Faults), "GPUHEALTH_BENCH_OUT="+absPath(out),
			"GPUHEALTH_BENCH_REPORTERS=annotation,devicetaint,condition")
		if _, err := runLogged(cmd, filepath.Join(o.Raw, "latency-"+run+".log")); err != nil {
			return nil, err
		}
		got, err := readRun(out, partLatency, run)
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
