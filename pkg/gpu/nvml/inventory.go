package nvml

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// inventory lists every GPU NVML reports, with its MIG devices, and what it can be asked.
func (b *Backend) inventory() error {
	if v, ret := b.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		b.driverVersion = v
	}
	count, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nvmlError("counting GPUs", ret)
	}
	for i := range count {
		g, err := b.identify(i)
		if err != nil {
			b.skip(err)
			continue
		}
		b.describe(g)
		if err := b.migInventory(g); err != nil {
			b.skip(fmt.Errorf("GPU %d (%s): MIG instances: %w", i, g.dev.UUID, err))
		} else {
			g.migComplete = true
		}
		for r, why := range b.sym.readingsOff() {
			g.setOff(r, why)
		}
		b.readECCMode(g)
		b.readMIGLimits(g)
		b.gpus = append(b.gpus, g)
		b.devices = append(b.devices, g.dev)
		b.devices = append(b.devices, g.migs...)
	}
	return nil
}

// identify gets GPU i's handle and UUID, without which it cannot be tracked.
func (b *Backend) identify(i int) (*gpu, error) {
	handle, ret := b.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, unidentified(fmt.Sprintf("GPU %d", i), nvmlError("getting its handle", ret), ret)
	}
	uuid, ret := handle.GetUUID()
	if ret != nvml.SUCCESS {
		where := fmt.Sprintf("GPU %d", i)
		if pci, pret := handle.GetPciInfo(); pret == nvml.SUCCESS && busID(pci) != "" {
			where += " at PCI " + busID(pci)
		}
		return nil, unidentified(where, nvmlError("reading its UUID", ret), ret)
	}
	return &gpu{handle: handle, dev: health.Device{UUID: uuid, Index: i, Minor: -1}}, nil
}

// unidentified explains why a GPU was left out. A broken GPU (lost, in need of a reset, or
// failing with an unknown error) wraps ErrGPULost: NVIDIA's device plugin would mark it
// unhealthy, but without a UUID there is nothing here to mark.
func unidentified(where string, err error, ret nvml.Return) error {
	if unidentifiable(ret) {
		return fmt.Errorf("%s: %w: %w", where, ErrGPULost, err)
	}
	return fmt.Errorf("%s: %w", where, err)
}

// describe reads the attributes of an identified GPU. An answer that says the GPU is broken is
// kept for Run to report; any other failure leaves the attribute unknown.
func (b *Backend) describe(g *gpu) {
	h := g.handle
	minor, ret := h.GetMinorNumber()
	if ret == nvml.SUCCESS {
		g.dev.Minor = minor
	}
	g.noteFault(ret)
	name, ret := h.GetName()
	if ret == nvml.SUCCESS {
		g.dev.Model = name
	}
	g.noteFault(ret)
	pci, ret := h.GetPciInfo()
	if ret == nvml.SUCCESS {
		g.dev.PCIBusID = busID(pci)
	}
	g.noteFault(ret)
	b.readSerial(g)
	b.readVBIOS(g)
	b.readArchitecture(g)
}

// readSerial reads the board's serial number, an attribute no GPU needs to be tracked: NVML
// answers NOT_SUPPORTED on GeForce boards, which have none.
func (b *Backend) readSerial(g *gpu) {
	b.readAttribute(g, symSerial, g.handle.GetSerial, &g.dev.Serial)
}

// readVBIOS reads the version of the board's video BIOS ("96.00.89.00.01"), an attribute as the
// serial is and as optional.
func (b *Backend) readVBIOS(g *gpu) {
	b.readAttribute(g, symVBIOS, g.handle.GetVbiosVersion, &g.dev.VBIOS)
}

// readAttribute reads an optional string attribute of a board into out: without the call (sym
// missing from the library) or with any error it stays unknown and the GPU is opened all the
// same; an answer that says the GPU is broken is kept for Run to report, as for the other
// attributes.
func (b *Backend) readAttribute(g *gpu, sym string, read func() (string, nvml.Return), out *string) {
	if !b.sym.has(sym) {
		return
	}
	v, ret := read()
	if ret == nvml.SUCCESS {
		*out = strings.TrimSpace(v)
	}
	g.noteFault(ret)
}

// readArchitecture learns whether the GPU is Ampere or later: those remap rows instead of
// retiring pages, and their DRAM retirement events are about the row remapper. Without the
// call (a driver before R450, which predates Ampere) or an answer, the GPU is taken to be older.
func (b *Backend) readArchitecture(g *gpu) {
	if !b.sym.has(symArchitecture) {
		return
	}
	arch, ret := g.handle.GetArchitecture()
	g.noteFault(ret)
	g.rowRemapper = ret == nvml.SUCCESS && arch >= nvml.DEVICE_ARCH_AMPERE && arch != nvml.DEVICE_ARCH_UNKNOWN
}

func (b *Backend) skip(err error) {
	if errors.Is(err, ErrGPULost) {
		b.log.Error(err, "GPU is broken and has no readable UUID: it is left out of the inventory, so it cannot be tracked or marked Unhealthy")
	} else {
		b.log.Error(err, "GPU left out of the inventory")
	}
	b.skipped = append(b.skipped, err)
}

// migInventory lists the MIG instances of a GPU in MIG mode. A driver without the MIG functions
// predates MIG: its GPUs have no MIG devices.
func (b *Backend) migInventory(g *gpu) error {
	if !b.sym.hasAll(migSymbols) {
		return nil
	}
	current, _, ret := g.handle.GetMigMode()
	if notSupported(ret) || (ret == nvml.SUCCESS && current != nvml.DEVICE_MIG_ENABLE) {
		return nil
	}
	if ret != nvml.SUCCESS {
		g.noteFault(ret)
		return nvmlError("reading MIG mode", ret)
	}
	g.migEnabled = true
	n, ret := g.handle.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nvmlError("counting MIG devices", ret)
	}
	var errs []error
	for j := range n {
		d, err := b.migDevice(g, j)
		switch {
		case err != nil:
			errs = append(errs, err)
		case d != nil:
			g.migs = append(g.migs, *d)
		}
	}
	return errors.Join(errs...)
}

// migDevice reads MIG device slot j of g; an empty slot is nil.
func (b *Backend) migDevice(g *gpu, j int) (*health.Device, error) {
	mig, ret := g.handle.GetMigDeviceHandleByIndex(j)
	if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
		return nil, nil // MIG device slots are sparse
	}
	if ret != nvml.SUCCESS {
		return nil, nvmlError(fmt.Sprintf("MIG device %d: getting its handle", j), ret)
	}
	uuid, ret := mig.GetUUID()
	if ret != nvml.SUCCESS {
		return nil, nvmlError(fmt.Sprintf("MIG device %d: reading its UUID", j), ret)
	}
	gi, ret := mig.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return nil, nvmlError(fmt.Sprintf("MIG device %s: reading its GPU instance", uuid), ret)
	}
	ci, ret := mig.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return nil, nvmlError(fmt.Sprintf("MIG device %s: reading its compute instance", uuid), ret)
	}
	d := health.Device{
		UUID: uuid, Index: g.dev.Index, Minor: g.dev.Minor, PCIBusID: g.dev.PCIBusID,
		Model: g.dev.Model + " MIG",
		MIG:   &health.MIGPlacement{ParentUUID: g.dev.UUID, GPUInstance: uint32(gi), ComputeInstance: uint32(ci)},
	}
	if name, ret := mig.GetName(); ret == nvml.SUCCESS && name != "" {
		d.Model = name
	}
	return &d, nil
}

// busID reads the PCI bus ID NVML reports, preferring the long form.
func busID(p nvml.PciInfo) string {
	if s := cString(p.BusId[:]); s != "" {
		return s
	}
	return cString(p.BusIdLegacy[:])
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
