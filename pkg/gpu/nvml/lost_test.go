package nvml_test

import (
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// NVML may answer a lost GPU's UUID from its cache; a reading that touches the hardware answers
// NVML_ERROR_GPU_IS_LOST ("the target GPU has fallen off the bus or is otherwise inaccessible").
// The fixture's uuidCached answers so.

func TestLostGPUWhoseUUIDNVMLStillKnows(t *testing.T) {
	t.Run("Wait answers GPU_IS_LOST: the lost GPU leaves the event set", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		rec.Take()
		first := f.lastSet()
		f.update(4, func(s *gpuState) { s.lost, s.uuidCached = true, true })
		f.send(nvml.EventData{}, nvml.ERROR_GPU_IS_LOST)
		got := rec.TakeUntil(t, "lost", healthtest.OfKind(health.SignalLost, f.uuid(4)))
		if kinds := kindsBy(got); len(kinds) != 1 {
			t.Errorf("signals = %v, want only GPU 4 lost", kinds)
		}
		// NVML cannot take one GPU off a set: after the backoff a new set is made without it.
		f.stepUntil("a new event set", time.Second, func() bool { return b.Stats().EventSetRebuilds == 1 })
		f.mu.Lock()
		freed := first.freed
		f.mu.Unlock()
		if !freed {
			t.Error("the first event set was not freed")
		}
		second := f.lastSet()
		for i := range f.gpus {
			if got := f.registeredOn(second, i); (got == 0) != (i == 4) {
				t.Errorf("GPU %d registered %#x on the new set, want everything but lost GPU 4", i, got)
			}
		}
	})
	t.Run("an event no GPU can be tied to marks only the lost one", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		rec.Take()
		f.update(6, func(s *gpuState) { s.lost, s.uuidCached = true, true })
		gone := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }}
		f.send(nvml.EventData{Device: gone, EventType: nvml.EventTypeXidCriticalError, EventData: 79,
			GpuInstanceId: health.NoInstance, ComputeInstanceId: health.NoInstance}, nvml.SUCCESS)
		got := rec.TakeUntil(t, "lost", healthtest.OfKind(health.SignalLost, f.uuid(6)))
		if kinds := kindsBy(got); len(kinds) != 1 || !slices.Equal(kinds[f.uuid(6)], []health.SignalKind{health.SignalLost}) {
			t.Errorf("signals = %v, want only GPU 6 lost", kinds)
		}
	})
}

func TestLostGPU(t *testing.T) {
	t.Run("an event whose handle is gone marks only the GPU that stopped answering", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		rec.Take()
		f.update(6, func(s *gpuState) { s.lost = true })
		gone := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }}
		f.send(nvml.EventData{Device: gone, EventType: nvml.EventTypeXidCriticalError, EventData: 79,
			GpuInstanceId: health.NoInstance, ComputeInstanceId: health.NoInstance}, nvml.SUCCESS)
		got := rec.TakeUntil(t, "lost", healthtest.OfKind(health.SignalLost, f.uuid(6)))
		if kinds := kindsBy(got); len(kinds) != 1 || !slices.Equal(kinds[f.uuid(6)], []health.SignalKind{health.SignalLost}) {
			t.Errorf("signals = %v, want only GPU 6 lost", kinds)
		}
		if n := b.Stats().Unattributed; n != 1 {
			t.Errorf("Stats.Unattributed = %d, want 1", n)
		}
	})
	t.Run("an event nobody can be tied to goes to every GPU", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		rec.Take()
		f.send(nvml.EventData{Device: nil, EventType: nvml.EventTypeXidCriticalError, EventData: 79,
			GpuInstanceId: health.NoInstance, ComputeInstanceId: health.NoInstance}, nvml.SUCCESS)
		got := rec.TakeUntil(t, "XIDs", healthtest.OfKind(health.SignalXID, f.uuid(7)))
		if kinds := kindsBy(got); len(kinds) != 8 {
			t.Errorf("signals = %v, want the XID on all 8 GPUs", kinds)
		}
	})
	t.Run("the sampler finds a lost GPU", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		rec.Take()
		f.update(1, func(s *gpuState) { s.lost = true })
		f.step(b)
		got := rec.Take()
		if s := sigsOf(got, f.uuid(1)); !slices.Equal(s, []sig{{Kind: health.SignalLost}}) {
			t.Errorf("GPU 1 signals = %+v, want only lost", s)
		}
		if !slices.ContainsFunc(got, healthtest.OfKind(health.SignalSample, f.uuid(0))) {
			t.Error("the other GPUs were not sampled")
		}
	})
	t.Run("Wait says a GPU is lost without saying which", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		rec.Take()
		f.update(4, func(s *gpuState) { s.lost = true })
		f.send(nvml.EventData{}, nvml.ERROR_GPU_IS_LOST)
		got := rec.TakeUntil(t, "lost", healthtest.OfKind(health.SignalLost, f.uuid(4)))
		if kinds := kindsBy(got); len(kinds) != 1 {
			t.Errorf("signals = %v, want only GPU 4 lost", kinds)
		}
		healthtest.Eventually(t, "the wait error to be counted", func() bool { return b.Stats().WaitErrors == 1 })
	})
	t.Run("registration on a lost GPU", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		f.update(0, func(s *gpuState) { s.lost = true })
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		if got := rec.Take(); !slices.ContainsFunc(got, healthtest.OfKind(health.SignalLost, f.uuid(0))) {
			t.Errorf("no lost signal for GPU 0: %v", got)
		}
	})
}

// kindsBy groups signal kinds by device, sampling rounds left out.
func kindsBy(sigs []health.Signal) map[string][]health.SignalKind {
	out := map[string][]health.SignalKind{}
	for _, s := range without(sigs, health.SignalSample) {
		out[s.Device] = append(out[s.Device], s.Kind)
	}
	return out
}
