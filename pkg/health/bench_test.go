//go:build !race

// Benchmarks and allocation checks; the race detector changes both, so they build without it.

package health_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func benchDevices(n int) []health.Device {
	devs := make([]health.Device, n)
	for i := range devs {
		devs[i] = health.Device{UUID: fmt.Sprintf("GPU-bench-%02d", i), Index: i, Model: "bench"}
	}
	return devs
}

func newBenchTracker(b *testing.B, n int) (*health.Tracker, []health.Device) {
	b.Helper()
	devs := benchDevices(n)
	tr, err := health.NewTracker(health.DefaultPolicy(), devs)
	if err != nil {
		b.Fatal(err)
	}
	return tr, devs
}

func reportThroughput(b *testing.B, signals int) {
	b.ReportMetric(float64(signals)/b.Elapsed().Seconds(), "signals/s")
}

// BenchmarkXIDStorm is one device flooded with the same XID: after the first signal, every
// signal must change nothing, allocate nothing and cost as little as possible.
func BenchmarkXIDStorm(b *testing.B) {
	for _, xid := range []uint32{79, 13} {
		b.Run(fmt.Sprintf("xid=%d", xid), func(b *testing.B) {
			tr, devs := newBenchTracker(b, 8)
			start := time.Unix(0, 0)
			buf := make([]health.Transition, 0, 16)
			sig := health.XIDSignal(devs[0].UUID, xid, start)
			if _, err := tr.Observe(sig, buf); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				sig.Time = start.Add(time.Duration(i) * time.Microsecond)
				out, _ := tr.Observe(sig, buf[:0])
				if len(out) != 0 {
					b.Fatalf("repeated signal produced %d transitions", len(out))
				}
			}
			reportThroughput(b, b.N)
		})
	}
}

// BenchmarkMixedLoad cycles every kind of signal over 8 devices, as the NVML sampler and event
// loop would produce them, with faults coming and going.
func BenchmarkMixedLoad(b *testing.B) {
	tr, devs := newBenchTracker(b, 8)
	start := time.Unix(0, 0)
	kinds := []health.Signal{
		{Kind: health.SignalECCCounters, Corrected: 10},
		{Kind: health.SignalRemappedRows},
		{Kind: health.SignalRetiredPages},
		{Kind: health.SignalTemperature, Value: 60, SlowdownC: 90, ShutdownC: 95},
		{Kind: health.SignalClockEvents},
		{Kind: health.SignalPCIeReplays, Value: 1},
		{Kind: health.SignalNVLinkState, Link: 1},
		{Kind: health.SignalNVLinkErrors, Link: 1, Value: 2},
		{Kind: health.SignalRecoveryAction},
		{Kind: health.SignalXID, XID: 13},
		{Kind: health.SignalXID, XID: 48},
		{Kind: health.SignalTemperature, Value: 92, SlowdownC: 90, ShutdownC: 95},
		{Kind: health.SignalSample},
	}
	buf := make([]health.Transition, 0, 64)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		sig := kinds[i%len(kinds)]
		sig.Device = devs[(i/len(kinds))%len(devs)].UUID
		sig.Time = start.Add(time.Duration(i) * time.Millisecond)
		if i%100_000 == 99_999 {
			// Reset the GPU now and then so that faults clear and are raised again.
			sig = health.Signal{Kind: health.SignalReset, Device: sig.Device, Time: sig.Time}
		}
		if _, err := tr.Observe(sig, buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
	reportThroughput(b, b.N)
}

// BenchmarkStormRetainedMemory shows that the memory a tracker holds does not grow with the
// length of a storm: retained-B is the live heap after the storm minus before it.
func BenchmarkStormRetainedMemory(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprintf("signals=%d", n), func(b *testing.B) {
			var retained uint64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				tr, devs := newBenchTracker(b, 8)
				start := time.Unix(0, 0)
				for i := range n {
					_, _ = tr.Observe(health.XIDSignal(devs[i%8].UUID, uint32(31+i%2*48), start.Add(time.Duration(i))), nil)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				retained = after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc)
				runtime.KeepAlive(tr)
			}
			b.ReportMetric(float64(retained), "retained-B")
		})
	}
}

// TestRepeatedSignalsDoNotAllocate pins the storm path at zero allocations: a count, not a time.
func TestRepeatedSignalsDoNotAllocate(t *testing.T) {
	devs := benchDevices(11)
	tr, err := health.NewTracker(health.DefaultPolicy(), devs)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(0, 0)
	buf := make([]health.Transition, 0, 16)
	signals := []health.Signal{
		health.XIDSignal(devs[0].UUID, 79, start),
		health.XIDSignal(devs[1].UUID, 13, start),
		{Kind: health.SignalTemperature, Device: devs[2].UUID, Value: 97, Time: start},
		{Kind: health.SignalClockEvents, Device: devs[3].UUID, Reasons: health.ClockEventHWPowerBrake, Time: start},
		{Kind: health.SignalECCCounters, Device: devs[4].UUID, Uncorrected: 3, Time: start},
		{Kind: health.SignalNVLinkState, Device: devs[5].UUID, Link: 2, Down: true, Time: start},
		{Kind: health.SignalLost, Device: devs[6].UUID, Time: start},
		{Kind: health.SignalRecoveryAction, Device: devs[7].UUID, Action: health.RecoveryBusReset, Time: start},
		{Kind: health.SignalRecoveryAction, Device: devs[8].UUID, Action: 200, Time: start},
		{Kind: health.SignalResetRequired, Device: devs[9].UUID, Time: start},
	}
	for _, sig := range signals {
		t.Run(sig.Kind.String(), func(t *testing.T) {
			// Reach the steady state first: an XID that repeats in separate bursts raises its
			// repeat rule's condition once, and from then on changes nothing.
			for k := range 10 {
				s := sig
				s.Time = start.Add(time.Duration(k) * time.Minute)
				if _, err := tr.Observe(s, buf[:0]); err != nil {
					t.Fatal(err)
				}
			}
			i := 0
			allocs := testing.AllocsPerRun(1000, func() {
				i++
				s := sig
				s.Time = start.Add(10*time.Minute + time.Duration(i)*time.Second)
				out, _ := tr.Observe(s, buf[:0])
				if len(out) != 0 {
					t.Fatalf("repeated %s produced a transition", sig.Kind)
				}
			})
			if allocs != 0 {
				t.Errorf("repeated %s: %v allocations per signal, want 0", sig.Kind, allocs)
			}
		})
	}
}

// BenchmarkXIDFloodEveryGPU is NVSentinel#1712's flood: XID 45 at 1,000/s on each of 8 GPUs, with
// the default repeat rules judging it. changes is how often the tracker's state changed over the
// whole run (each change is at most one write per sink): the few conditions and the node finding
// the flood raises, however long it lasts. retained-B is the tracker's live heap after the flood.
func BenchmarkXIDFloodEveryGPU(b *testing.B) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tr, devs := newBenchTracker(b, 8)
	start := time.Unix(0, 0)
	buf := make([]health.Transition, 0, 16)
	gen := tr.Generation()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		// Signal i goes to GPU i%8: each GPU sees one every 8 × 125 µs = 1 ms.
		sig := health.XIDSignal(devs[i%8].UUID, 45, start.Add(time.Duration(i)*125*time.Microsecond))
		_, _ = tr.Observe(sig, buf[:0])
	}
	b.StopTimer()
	b.ReportMetric(float64(tr.Generation()-gen), "changes")
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-min(after.HeapAlloc, before.HeapAlloc)), "retained-B")
	runtime.KeepAlive(tr)
	reportThroughput(b, b.N)
}
