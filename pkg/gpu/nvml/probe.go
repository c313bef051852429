package nvml

import (
	"maps"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Report is what Probe finds: each GPU's identity, the events it supports, and one round of
// readings.
type Report struct {
	DriverVersion string `json:"driverVersion,omitempty"`
	// Library is the NVML library file loaded.
	Library string      `json:"library,omitempty"`
	GPUs    []GPUReport `json:"gpus"`
	// Skipped says why GPUs that NVML lists were left out of the inventory.
	Skipped []string `json:"skipped,omitempty"`
}

// GPUReport is one GPU in a Report.
type GPUReport struct {
	Device     health.Device   `json:"device"`
	MIGDevices []health.Device `json:"migDevices,omitempty"`
	// Events names the watched event types the GPU supports; EventsError says why they could
	// not be read (NOT_SUPPORTED leaves Events empty: the GPU would be unmonitored).
	Events      []string `json:"events"`
	EventsError string   `json:"eventsError,omitempty"`
	// Unmonitored names the readings the backend does not take on this GPU, and why: the driver
	// lacks their NVML functions, ECC is off, or MIG mode stops them. Their checks do not run (no
	// data, not healthy).
	Unmonitored map[string]string `json:"unmonitored,omitempty"`
	Readings    Readings          `json:"readings"`
}

// Probe reads every GPU once, without sending signals anywhere and without registering events:
// what `gpuhealth probe` prints. It does not update the reset-detection memory of Run.
func (b *Backend) Probe() Report {
	rep := Report{DriverVersion: b.driverVersion, Library: b.library, GPUs: []GPUReport{}}
	for _, err := range b.skipped {
		rep.Skipped = append(rep.Skipped, err.Error())
	}
	for _, g := range b.gpus {
		gr := GPUReport{Device: g.dev, MIGDevices: g.migs, Events: []string{}, Unmonitored: maps.Clone(g.off)}
		mask, ret := b.supportedEvents(g)
		switch {
		case ret == nvml.SUCCESS:
			gr.Events = append(gr.Events, EventNames(mask)...)
		case b.eventsOff != "":
			gr.EventsError = b.eventsOff
		case notSupported(ret):
		default:
			gr.EventsError = nvmlError("reading supported events", ret).Error()
		}
		gr.Readings = b.read(g)
		rep.GPUs = append(rep.GPUs, gr)
	}
	return rep
}
