package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

// measureLibrary runs the library, kernel-log and extender benchmarks (testing.B, five times, one core) and
// turns every result into figures: one per benchmark, unit and run. The extender's include
// BenchmarkExtenderFilterWithSlowClients, about 8 s a run: its one iteration serves the extender
// over loopback and times /filter with and without slow clients.
func measureLibrary(ctx context.Context, o options) ([]figure.Figure, error) {
	progress("library, extender and simulated-driver benchmarks (go test -bench, -count 5, one core; about two minutes)")
	raw := filepath.Join(o.Raw, "bench.txt")
	// -p 1: one package's benchmarks at a time. go test runs as many test binaries at once as
	// there are CPUs, and on 2 CPUs two benchmark binaries (and the compiles of the next) measured
	// each other: BenchmarkXIDStorm read 160 ns/op beside another package, 115 alone.
	cmd := exec.CommandContext(ctx, "go", "test", "-p", "1", "-run", "^$", "-bench", ".", "-benchmem", "-count", "5", "-cpu", "1",
		"./pkg/health/...", "./pkg/gpu/kmsg/...", "./internal/scheduling/...", "./internal/simdriver/...")
	out, err := runLogged(cmd, raw)
	if err != nil {
		return nil, err
	}
	figs, err := parseBench(out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", raw, err)
	}
	return figs, nil
}

// parseBench reads `go test -bench` output, Go's benchmark format: a result line is
// "BenchmarkName[-GOMAXPROCS] iterations value unit [value unit]...". Each result becomes one
// figure per unit, part library, run n for the nth result of that benchmark, with the iterations
// as its samples. Other lines (package headers, PASS, logs) are skipped; a result line that does
// not parse is an error naming the line.
func parseBench(out []byte) ([]figure.Figure, error) {
	var figs []figure.Figure
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		iterations, err := strconv.Atoi(f[1])
		if err != nil {
			continue // "BenchmarkX  file_test.go:12: ..." is a log line, not a result
		}
		pairs := f[2:]
		if len(pairs) == 0 || len(pairs)%2 != 0 {
			return nil, fmt.Errorf("line %d: %q: want value-unit pairs after the iterations", n, sc.Text())
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the GOMAXPROCS suffix
			}
		}
		seen[name]++
		run := strconv.Itoa(seen[name])
		for i := 0; i < len(pairs); i += 2 {
			v, err := strconv.ParseFloat(pairs[i], 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: %s: value %q of %s: %w", n, name, pairs[i], pairs[i+1], err)
			}
			figs = append(figs, figure.Figure{Part: partLibrary, Run: run, Name: name, Unit: pairs[i+1], Value: v, Samples: iterations})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(figs) == 0 {
		return nil, fmt.Errorf("no benchmark results")
	}
	return figs, nil
}
