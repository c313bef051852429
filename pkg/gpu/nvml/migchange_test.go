package nvml_test

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// A MIG layout that changes under a running backend (mig-parted, nvidia-smi mig) ends Run with an
// *InventoryChangedError naming the GPU and both layouts: at once after NVML's MIG
// configuration-change event, and at the latest at the periodic inventory check without one.
func TestMIGLayoutChangeEndsRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		check time.Duration
		event bool
	}{
		{"NVML's MIG configuration-change event", time.Hour, true},
		{"the periodic inventory check", time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			uuids := f.enableMIG(2, 2)
			var served atomic.Int32
			served.Store(2)
			d := f.device(2)
			all := d.GetMigDeviceHandleByIndexFunc
			d.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
				if j >= int(served.Load()) {
					return nil, nvml.ERROR_NOT_FOUND
				}
				return all(j)
			}
			b := f.open(gpunvml.WithInventoryCheck(tc.check))
			done := f.runToEnd(b, &healthtest.Recorder{})

			served.Store(1) // MIG device 2 destroyed
			if tc.event {
				f.send(nvml.EventData{Device: f.srv.Devices[2], EventType: nvml.EventMigConfigChange}, nvml.SUCCESS)
				healthtest.Eventually(t, "the event", func() bool { return b.Stats().Events >= 1 })
			}
			// The change must be seen within this many sampling periods of the fake clock.
			limit := 1 + int(tc.check/samplePeriod)
			if tc.event {
				limit = 1
			}
			var err error
			for steps := 0; ; steps++ {
				rounds := b.Stats().Rounds
				select {
				case err = <-done:
				default:
					if steps > limit {
						t.Fatalf("Run still running %d sampling periods after the MIG layout changed", steps)
					}
					f.clock.Step(samplePeriod)
					healthtest.Eventually(t, "the next round or the end of Run", func() bool { return b.Stats().Rounds > rounds || len(done) > 0 })
					continue
				}
				break
			}
			var changed *gpunvml.InventoryChangedError
			if !errors.As(err, &changed) || !errors.Is(err, gpunvml.ErrInventoryChanged) {
				t.Fatalf("Run = %v, want an *InventoryChangedError", err)
			}
			if changed.GPU != f.uuid(2) || changed.Index != 2 || !changed.MIGBefore || !changed.MIGAfter ||
				!slices.Equal(changed.Before, uuids) || !slices.Equal(changed.After, uuids[:1]) {
				t.Errorf("InventoryChangedError = %+v, want GPU 2 from %v to %v", changed, uuids, uuids[:1])
			}
			if c, fr := f.creates.Load(), f.frees.Load(); c != fr {
				t.Errorf("%d event sets created, %d freed: want every one freed", c, fr)
			}
		})
	}
}
