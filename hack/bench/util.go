package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

// runLogged runs cmd with its output in logPath (and returns it); on failure the error carries
// the log's tail.
func runLogged(cmd *exec.Cmd, logPath string) ([]byte, error) {
	var buf bytes.Buffer
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd.Stdout = io.MultiWriter(f, &buf)
	cmd.Stderr = cmd.Stdout
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, lastLines(buf.Bytes(), 40))
	}
	return buf.Bytes(), nil
}

func lastLines(b []byte, n int) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runTest runs one e2e test (-tags e2e) of pkg that writes its figures as JSON lines to the file
// outEnv names, logs to name.log in the raw directory, and returns the figures as part and run.
func runTest(ctx context.Context, o options, test, pkg, outEnv, name, part, run string, env ...string) ([]figure.Figure, error) {
	out := filepath.Join(o.Raw, name+".jsonl")
	_ = os.Remove(out)
	timeout := cmp.Or(o.testTimeout, 20*time.Minute)
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-tags", "e2e", "-run", "^"+test+"$", "-timeout", timeout.String(), "-v", pkg)
	cmd.Env = append(append(os.Environ(), outEnv+"="+absPath(out)), env...)
	if _, err := runLogged(cmd, filepath.Join(o.Raw, name+".log")); err != nil {
		return nil, err
	}
	return readRun(out, part, run)
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func collect[T any](xs []T, f func(T) float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

func millions(v float64) string { return fmt.Sprintf("%.1f M", v/1e6) }

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

func thousands(n int) string {
	s := strconv.Itoa(n)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// byKind lists counts by kind, most first: "PATCH nodes 400, POST events 400".
func byKind(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), strings.Compare(a, b)) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.0f", k, m[k])
	}
	return strings.Join(parts, ", ")
}
