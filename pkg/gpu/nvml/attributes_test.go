package nvml_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// attributeCase is one answer of NVML to an optional attribute's call on GPU 1.
type attributeCase struct {
	name string
	// change sets GPU 1's answer; missing removes the symbol from the library.
	change  func(*gpuState)
	missing bool
	want    string
	// lost: the answer says the GPU is broken, which Run reports as the other attributes'
	// answers are.
	lost bool
}

// The board serial and the VBIOS version are optional: whatever NVML answers, or when the
// library lacks the call, the GPU is opened and tracked; only a value NVML gave is reported.
func TestOpenReadsOptionalAttributesWhenItCan(t *testing.T) {
	for _, attr := range []struct {
		name, symbol, gpu2 string
		// hook wraps a device's call with count.
		hook  func(d *server.Device, count func())
		get   func(health.Device) string
		cases []attributeCase
	}{
		{name: "serial", symbol: "nvmlDeviceGetSerial", gpu2: "1650923000002",
			hook: func(d *server.Device, count func()) {
				read := d.GetSerialFunc
				d.GetSerialFunc = func() (string, nvml.Return) { count(); return read() }
			},
			get: func(d health.Device) string { return d.Serial },
			cases: []attributeCase{
				{name: "a data-center board", want: "1650923000001"},
				{name: "padded by the driver", change: func(s *gpuState) { s.serial = " 1650923000001 " }, want: "1650923000001"},
				{name: "a board without one (GeForce)", change: func(s *gpuState) { s.unsupported["serial"] = true }},
				{name: "an unknown error", change: func(s *gpuState) { s.failing["serial"] = true }},
				{name: "no permission", change: func(s *gpuState) { s.rets["serial"] = nvml.ERROR_NO_PERMISSION }},
				{name: "a library without nvmlDeviceGetSerial", missing: true},
				{name: "a GPU lost after its UUID was read", change: func(s *gpuState) { s.rets["serial"] = nvml.ERROR_GPU_IS_LOST }, lost: true},
			}},
		{name: "vbios", symbol: "nvmlDeviceGetVbiosVersion", gpu2: "96.00.89.00.01",
			hook: func(d *server.Device, count func()) {
				read := d.GetVbiosVersionFunc
				d.GetVbiosVersionFunc = func() (string, nvml.Return) { count(); return read() }
			},
			get: func(d health.Device) string { return d.VBIOS },
			cases: []attributeCase{
				{name: "an H100 SXM", want: "96.00.89.00.01"},
				{name: "one board flashed apart from the others", change: func(s *gpuState) { s.vbios = "96.00.99.00.03" }, want: "96.00.99.00.03"},
				{name: "padded by the driver", change: func(s *gpuState) { s.vbios = " 96.00.89.00.01 " }, want: "96.00.89.00.01"},
				{name: "not supported", change: func(s *gpuState) { s.unsupported["vbios"] = true }},
				{name: "an unknown error", change: func(s *gpuState) { s.failing["vbios"] = true }},
				{name: "no permission", change: func(s *gpuState) { s.rets["vbios"] = nvml.ERROR_NO_PERMISSION }},
				{name: "a library without nvmlDeviceGetVbiosVersion", missing: true},
				{name: "a GPU lost after its UUID was read", change: func(s *gpuState) { s.rets["vbios"] = nvml.ERROR_GPU_IS_LOST }, lost: true},
			}},
	} {
		for _, tc := range attr.cases {
			t.Run(attr.name+"/"+tc.name, func(t *testing.T) {
				f := newFixture(t)
				if tc.change != nil {
					f.update(1, tc.change)
				}
				calls := 0
				if tc.missing {
					f.missing[attr.symbol] = true
					for i := range f.gpus {
						attr.hook(f.device(i), func() { calls++ }) // Open runs in this goroutine
					}
				}
				b := f.open()
				if calls != 0 {
					t.Errorf("%s called %d times on a library without it", attr.symbol, calls)
				}
				devs := b.Devices()
				if len(devs) != 8 || len(b.Skipped()) != 0 {
					t.Fatalf("%d devices, skipped %v; want all 8 GPUs opened", len(devs), b.Skipped())
				}
				if got := attr.get(devs[1]); got != tc.want {
					t.Errorf("GPU 1 %s %q, want %q", attr.name, got, tc.want)
				}
				if got := attr.get(devs[2]); !tc.missing && got != attr.gpu2 {
					t.Errorf("GPU 2 %s %q, want %q: one GPU's answer is its own", attr.name, got, attr.gpu2)
				}
				rec := &healthtest.Recorder{}
				f.run(b, rec)
				if lost := len(rec.Signals(healthtest.OfKind(health.SignalLost, f.uuid(1)))) > 0; lost != tc.lost {
					t.Errorf("GPU 1 reported lost: %v, want %v", lost, tc.lost)
				}
			})
		}
	}
}
