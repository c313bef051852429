package nvml_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// The board serial is optional: whatever nvmlDeviceGetSerial answers, or when the library lacks
// it, the GPU is opened and tracked; only a serial NVML gave is reported.
func TestOpenReadsTheSerialWhenItCan(t *testing.T) {
	cases := []struct {
		name string
		// change sets GPU 1's answer; missing removes the symbol from the library.
		change  func(*gpuState)
		missing bool
		want    string
		// lost: the answer says the GPU is broken, which Run reports as the other attributes'
		// answers are.
		lost bool
	}{
		{name: "a data-center board", want: "1650923000001"},
		{name: "padded by the driver", change: func(s *gpuState) { s.serial = " 1650923000001 " }, want: "1650923000001"},
		{name: "a board without one (GeForce)", change: func(s *gpuState) { s.unsupported["serial"] = true }},
		{name: "an unknown error", change: func(s *gpuState) { s.failing["serial"] = true }},
		{name: "no permission", change: func(s *gpuState) { s.rets["serial"] = nvml.ERROR_NO_PERMISSION }},
		{name: "a library without nvmlDeviceGetSerial", missing: true},
		{name: "a GPU lost after its UUID was read", change: func(s *gpuState) { s.rets["serial"] = nvml.ERROR_GPU_IS_LOST }, lost: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.change != nil {
				f.update(1, tc.change)
			}
			calls := 0
			if tc.missing {
				f.missing["nvmlDeviceGetSerial"] = true
				for i := range f.gpus {
					serial := f.device(i).GetSerialFunc
					f.device(i).GetSerialFunc = func() (string, nvml.Return) {
						calls++ // Open runs in this goroutine
						return serial()
					}
				}
			}
			b := f.open()
			if calls != 0 {
				t.Errorf("nvmlDeviceGetSerial called %d times on a library without it", calls)
			}
			devs := b.Devices()
			if len(devs) != 8 || len(b.Skipped()) != 0 {
				t.Fatalf("%d devices, skipped %v; want all 8 GPUs opened", len(devs), b.Skipped())
			}
			if got := devs[1].Serial; got != tc.want {
				t.Errorf("GPU 1 serial %q, want %q", got, tc.want)
			}
			if want := "1650923000002"; !tc.missing && devs[2].Serial != want {
				t.Errorf("GPU 2 serial %q, want %q: one GPU's answer is its own", devs[2].Serial, want)
			}
			rec := &healthtest.Recorder{}
			f.run(b, rec)
			if lost := len(rec.Signals(healthtest.OfKind(health.SignalLost, f.uuid(1)))) > 0; lost != tc.lost {
				t.Errorf("GPU 1 reported lost: %v, want %v", lost, tc.lost)
			}
		})
	}
}
