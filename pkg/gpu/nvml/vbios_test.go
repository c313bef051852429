package nvml_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// The VBIOS version is optional, as the serial is: whatever nvmlDeviceGetVbiosVersion answers,
// or when the library lacks it, the GPU is opened and tracked; only a version NVML gave is
// reported, and a MIG instance has none.
func TestOpenReadsTheVBIOSWhenItCan(t *testing.T) {
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
		{name: "an H100 SXM", want: "96.00.89.00.01"},
		{name: "one board flashed apart from the others", change: func(s *gpuState) { s.vbios = "96.00.99.00.03" }, want: "96.00.99.00.03"},
		{name: "padded by the driver", change: func(s *gpuState) { s.vbios = " 96.00.89.00.01 " }, want: "96.00.89.00.01"},
		{name: "not supported", change: func(s *gpuState) { s.unsupported["vbios"] = true }},
		{name: "an unknown error", change: func(s *gpuState) { s.failing["vbios"] = true }},
		{name: "no permission", change: func(s *gpuState) { s.rets["vbios"] = nvml.ERROR_NO_PERMISSION }},
		{name: "a library without nvmlDeviceGetVbiosVersion", missing: true},
		{name: "a GPU lost after its UUID was read", change: func(s *gpuState) { s.rets["vbios"] = nvml.ERROR_GPU_IS_LOST }, lost: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.change != nil {
				f.update(1, tc.change)
			}
			calls := 0
			if tc.missing {
				f.missing["nvmlDeviceGetVbiosVersion"] = true
				for i := range f.gpus {
					vbios := f.device(i).GetVbiosVersionFunc
					f.device(i).GetVbiosVersionFunc = func() (string, nvml.Return) {
						calls++ // Open runs in this goroutine
						return vbios()
					}
				}
			}
			b := f.open()
			if calls != 0 {
				t.Errorf("nvmlDeviceGetVbiosVersion called %d times on a library without it", calls)
			}
			devs := b.Devices()
			if len(devs) != 8 || len(b.Skipped()) != 0 {
				t.Fatalf("%d devices, skipped %v; want all 8 GPUs opened", len(devs), b.Skipped())
			}
			if got := devs[1].VBIOS; got != tc.want {
				t.Errorf("GPU 1 VBIOS %q, want %q", got, tc.want)
			}
			if want := "96.00.89.00.01"; !tc.missing && devs[2].VBIOS != want {
				t.Errorf("GPU 2 VBIOS %q, want %q: one GPU's answer is its own", devs[2].VBIOS, want)
			}
			rec := &healthtest.Recorder{}
			f.run(b, rec)
			if lost := len(rec.Signals(healthtest.OfKind(health.SignalLost, f.uuid(1)))) > 0; lost != tc.lost {
				t.Errorf("GPU 1 reported lost: %v, want %v", lost, tc.lost)
			}
		})
	}
}
