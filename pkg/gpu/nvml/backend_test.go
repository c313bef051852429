package nvml_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestOpenTakesTheInventory(t *testing.T) {
	f := newFixture(t)
	migUUIDs := f.enableMIG(2, 2)
	b := f.open()

	if got, want := b.DriverVersion(), "550.54.15"; got != want {
		t.Errorf("DriverVersion = %q, want %q", got, want)
	}
	devs := b.Devices()
	if len(devs) != 8+2 {
		t.Fatalf("got %d devices, want 8 GPUs and 2 MIG devices: %+v", len(devs), devs)
	}
	var gpus []health.Device
	for _, d := range devs {
		if d.MIG == nil {
			gpus = append(gpus, d)
		}
	}
	for i, d := range gpus {
		want := health.Device{UUID: f.uuid(i), Index: i, Minor: i, PCIBusID: f.device(i).PciBusID, Model: "NVIDIA H100 80GB HBM3", Serial: f.gpus[i].serial,
			VBIOS: f.gpus[i].vbios}
		if d.UUID != want.UUID || d.Index != want.Index || d.Minor != want.Minor || d.PCIBusID != want.PCIBusID || d.Model != want.Model || d.Serial != want.Serial ||
			d.VBIOS != want.VBIOS {
			t.Errorf("GPU %d = %+v, want %+v", i, d, want)
		}
	}
	// MIG devices follow their parent.
	for j, uuid := range migUUIDs {
		d := devs[3+j]
		if d.UUID != uuid || d.MIG == nil {
			t.Fatalf("device %d = %+v, want MIG device %s", 3+j, d, uuid)
		}
		want := health.MIGPlacement{ParentUUID: f.uuid(2), GPUInstance: uint32(j), ComputeInstance: 0}
		if *d.MIG != want || d.Index != 2 || d.Model != "NVIDIA H100 80GB HBM3 MIG 1g.10gb" || d.Serial != "" || d.VBIOS != "" {
			t.Errorf("MIG device %d = %+v %+v, want index 2 and %+v", j, d, *d.MIG, want)
		}
	}
	// The inventory is valid for the library.
	if _, err := health.NewTracker(health.DefaultPolicy(), devs); err != nil {
		t.Errorf("NewTracker: %v", err)
	}
	if len(b.Skipped()) != 0 {
		t.Errorf("Skipped = %v, want none", b.Skipped())
	}
}

func TestOpenSkipsAGPUWithoutUUID(t *testing.T) {
	f := newFixture(t)
	f.update(5, func(s *gpuState) { s.lost = true })
	b := f.open()
	if n := len(b.Devices()); n != 7 {
		t.Errorf("got %d devices, want 7", n)
	}
	if sk := b.Skipped(); len(sk) != 1 || !errors.Is(sk[0], nvml.ERROR_GPU_IS_LOST) {
		t.Errorf("Skipped = %v, want one error wrapping ERROR_GPU_IS_LOST", sk)
	}
}

func TestOpenWithoutDriver(t *testing.T) {
	tests := []struct {
		name string
		ret  nvml.Return
	}{
		{"library not found", nvml.ERROR_LIBRARY_NOT_FOUND},
		{"driver not loaded", nvml.ERROR_DRIVER_NOT_LOADED},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			shutdowns := 0
			lib := &mock.Interface{
				InitFunc:     func() nvml.Return { return tc.ret },
				ShutdownFunc: func() nvml.Return { shutdowns++; return nvml.SUCCESS },
			}
			_, err := gpunvml.Open(lib)
			if !errors.Is(err, gpunvml.ErrNoDriver) || !errors.Is(err, tc.ret) {
				t.Errorf("Open = %v, want ErrNoDriver wrapping %v", err, tc.ret)
			}
			if shutdowns != 0 {
				t.Errorf("Shutdown called %d times after a failed Init", shutdowns)
			}
		})
	}
}

// The real library on a machine without the NVIDIA driver: a clear error, no panic.
func TestOpenRealLibraryWithoutDriver(t *testing.T) {
	b, err := gpunvml.Open(nvml.New())
	if err == nil {
		_ = b.Close()
		t.Skip("an NVIDIA driver is installed here")
	}
	if !errors.Is(err, gpunvml.ErrNoDriver) {
		t.Errorf("Open = %v, want ErrNoDriver", err)
	}
}

func TestOpenFailsCleanly(t *testing.T) {
	f := newFixture(t)
	f.srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	_, err := gpunvml.Open(f.srv)
	if !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("Open = %v, want an error wrapping ERROR_UNKNOWN", err)
	}
	if n := f.shutdowns.Load(); n != 1 {
		t.Errorf("Shutdown called %d times, want 1 (Init succeeded)", n)
	}
}

func TestCloseShutsDownOnce(t *testing.T) {
	f := newFixture(t)
	b, err := gpunvml.Open(f.srv)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if n := f.shutdowns.Load(); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
}

func TestProbe(t *testing.T) {
	f := newFixture(t)
	f.update(0, func(s *gpuState) { s.supportedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypePState })
	f.update(1, func(s *gpuState) {
		s.unsupported[gpunvml.ReadingRetiredPages] = true
		s.unsupported[gpunvml.ReadingNVLink] = true
		s.recovery = uint32(health.RecoveryGPUReset)
	})
	b := f.open()
	rep := b.Probe()
	if len(rep.GPUs) != 8 || rep.DriverVersion != "550.54.15" {
		t.Fatalf("Probe = %+v, want 8 GPUs and the driver version", rep)
	}
	if got := rep.GPUs[0].Events; !slices.Equal(got, []string{"xid"}) {
		t.Errorf("GPU 0 events = %v, want [xid]", got)
	}
	if got := rep.GPUs[2].Events; len(got) != 9 {
		t.Errorf("GPU 2 events = %v, want all 9 watched types", got)
	}
	r := rep.GPUs[1].Readings
	if r.Power == nil || r.Power.UsageMilliwatts != 120000 || r.Power.LimitMilliwatts != 700000 {
		t.Errorf("power = %+v, want 120000/700000 mW", r.Power)
	}
	if r.Temperature == nil || *r.Temperature != (gpunvml.TemperatureReading{CurrentC: 40, SlowdownC: 87, ShutdownC: 92}) {
		t.Errorf("temperature = %+v", r.Temperature)
	}
	if r.RecoveryAction == nil || *r.RecoveryAction != health.RecoveryGPUReset {
		t.Errorf("recovery action = %v, want gpuReset", r.RecoveryAction)
	}
	if !slices.Equal(r.Unsupported, []string{gpunvml.ReadingRetiredPages, gpunvml.ReadingNVLink}) {
		t.Errorf("unsupported = %v", r.Unsupported)
	}
	if r0 := rep.GPUs[0].Readings; len(r0.NVLinks) != 2 || r0.NVLinks[0].Errors == nil {
		t.Errorf("GPU 0 NVLinks = %+v, want 2 links with error counters", r0.NVLinks)
	}
}
