package simdriver

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// BenchmarkCallRoundTrip measures one library call's round trip to the simulator over its Unix
// socket, as the C library makes it (a fixed-size request and response on the thread's own
// connection), reading a GPU's temperature; it reports the p99 beside the mean. The C side adds
// two memcpy and no system call. The library needs no build here: the wire is spoken directly.
func BenchmarkCallRoundTrip(b *testing.B) {
	root, err := os.MkdirTemp("", "sdb-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n\ngpus: {count: 64}\n"))
	if err != nil {
		b.Fatal(err)
	}
	// A library directory with an empty profile: Install only copies the file.
	libs := b.TempDir()
	if err := os.MkdirAll(filepath.Join(libs, "550.163.01"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(libs, "550.163.01", "libnvidia-ml.so.550.163.01"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Options{Scenario: sc, DriverRoot: root, LibraryDir: libs, Logger: logr.Discard(), Ready: func() { close(ready) }})
	}()
	<-ready
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	c, err := net.Dial("unix", SocketPath(root))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	call := func(req *request) response {
		if err := writeRequest(c, req); err != nil {
			b.Fatal(err)
		}
		var resp response
		if err := readResponse(c, &resp); err != nil {
			b.Fatal(err)
		}
		return resp
	}
	call(&request{Op: opHello, A: uint32(os.Getpid()), B: wireVersion})
	call(&request{Op: opInit})
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		if r := call(&request{Op: opTemp, Dev: uint32(i%64) * migSlots}); r.Ret != retSuccess {
			b.Fatalf("ret %d", r.Ret)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	}
}
