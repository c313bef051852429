package simdriver

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// benchServer serves gpus simulated GPUs for a benchmark and returns a function that dials a
// consumer's connection to it (hello and init done).
func benchServer(b *testing.B, gpus int) func() net.Conn { return benchServerT(b, gpus, nil) }

// fakeLibraryDir is a library directory with an empty 550 profile: Install only copies the file.
func fakeLibraryDir(tb testing.TB) string {
	libs := tb.TempDir()
	if err := os.MkdirAll(filepath.Join(libs, "550.163.01"), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(libs, "550.163.01", "libnvidia-ml.so.550.163.01"), nil, 0o644); err != nil {
		tb.Fatal(err)
	}
	return libs
}

func driverEvent(action string) sim.Event {
	return sim.Event{Kind: sim.EventDriver, DriverAction: action, GPU: -1, Repeat: 1}
}

// benchServerT is benchServer for tests too; node, when set, is given the simulator's state.
func benchServerT(b testing.TB, gpus int, node func(*node)) func() net.Conn {
	root, err := os.MkdirTemp("", "sdb-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(root) })
	sc, err := sim.ParseScenario(fmt.Appendf(nil, "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n\ngpus: {count: %d}\n", gpus))
	if err != nil {
		b.Fatal(err)
	}
	libs := fakeLibraryDir(b)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Options{Scenario: sc, DriverRoot: root, LibraryDir: libs, Logger: logr.Discard(), Ready: func() { close(ready) },
			node: node})
	}()
	<-ready
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	return func() net.Conn {
		c, err := net.Dial("unix", SocketPath(root))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		// The library of the driver served (fakeLibraryDir's only profile).
		if err := hello(c, uint32(os.Getpid()), "550.163.01"); err != nil {
			b.Fatal(err)
		}
		return c
	}
}

func roundTrip(c net.Conn, req *request) (response, error) {
	var resp response
	if err := writeRequest(c, req); err != nil {
		return resp, err
	}
	return resp, readResponse(c, &resp)
}

// samplingRound is what gpuhealth's NVML sampler asks of one GPU each period.
var samplingRound = []request{
	{Op: opECCTotal, A: eccCorrected, B: eccVolatile}, {Op: opECCTotal, A: eccUncorrected, B: eccVolatile},
	{Op: opRemappedRows}, {Op: opTemp}, {Op: opTempThreshold, A: thresholdSlowdown}, {Op: opTempThreshold, A: thresholdShutdown},
	{Op: opPower}, {Op: opPower, A: 1}, {Op: opClockReasons}, {Op: opPCIeReplays}, {Op: opField, A: fieldRecoveryAction},
}

// BenchmarkSamplingRound64GPUs8Consumers measures one sampling period of 8 consumer processes
// (each on its own connection, as each has its own threads) reading every one of 64 GPUs as
// gpuhealth's sampler does: the CPU time of one round, simulator and clients together (an upper
// bound of the simulator's own), and what that is as a share of one core at the agent's default
// sampling period of 10 s.
func BenchmarkSamplingRound64GPUs8Consumers(b *testing.B) {
	const gpus, consumers = 64, 8
	dial := benchServer(b, gpus)
	conns := make([]net.Conn, consumers)
	for i := range conns {
		conns[i] = dial()
	}
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	b.ResetTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(func() {
				for g := range gpus {
					for _, req := range samplingRound {
						req.Dev = uint32(g * migSlots)
						if _, err := roundTrip(c, &req); err != nil {
							b.Error(err)
							return
						}
					}
				}
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) / time.Duration(b.N)
	b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms/round")
	b.ReportMetric(100*cpu.Seconds()/10, "core-%-at-10s")
	b.ReportMetric(float64(gpus*consumers*len(samplingRound)), "calls/round")
}

// BenchmarkCallRoundTrip measures one library call's round trip to the simulator over its Unix
// socket, as the C library makes it (a fixed-size request and response on the thread's own
// connection), reading a GPU's temperature; it reports the p99 beside the mean. The C side adds
// two memcpy and no system call. The library needs no build here: the wire is spoken directly.
func BenchmarkCallRoundTrip(b *testing.B) {
	c := benchServer(b, 64)()
	lat := make([]time.Duration, 0, 1<<16)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		if r, err := roundTrip(c, &request{Op: opTemp, Dev: uint32(i%64) * migSlots}); err != nil || r.Ret != retSuccess {
			b.Fatalf("ret %d, %v", r.Ret, err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1000, "p50-us")
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1000, "p99-us")
	}
}
