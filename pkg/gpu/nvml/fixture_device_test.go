package nvml_test

import (
	"encoding/binary"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

// wireDevice answers GPU i's calls from st.
func (f *fixture) wireDevice(i int, st *gpuState) {
	d := f.device(i)
	f.wireEvents(i, d, st)
	f.wireMemory(d, st)
	f.wireNVLink(d, st)
	uuid := d.UUID
	d.GetUUIDFunc = func() (string, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.checkLive("GetUUID")
		if st.lost && !st.uuidCached {
			return "", nvml.ERROR_GPU_IS_LOST
		}
		if ret := st.rets["uuid"]; ret != nvml.SUCCESS {
			return "", ret
		}
		return uuid, nvml.SUCCESS
	}
	// The fixture leaves the bus ID out of GetPciInfo; NVML fills it.
	pci := d.GetPciInfoFunc
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p, ret := pci()
		for i, c := range d.PciBusID {
			p.BusId[i] = int8(c)
		}
		return p, ret
	}
	d.GetSerialFunc = func() (string, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "serial"); ret != nvml.SUCCESS {
			return "", ret
		}
		return st.serial, nvml.SUCCESS
	}
	d.GetVbiosVersionFunc = func() (string, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "vbios"); ret != nvml.SUCCESS {
			return "", ret
		}
		return st.vbios, nvml.SUCCESS
	}
	d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "eccMode"); ret != nvml.SUCCESS {
			return 0, 0, ret
		}
		return st.eccCurrent, st.eccPending, nvml.SUCCESS
	}
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.arch, f.answer(st, "arch")
	}
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
		f.mu.Lock()
		if hang := st.hang; hang != nil { // a wedged GPU: the call returns when the test says
			f.mu.Unlock()
			<-hang
			f.mu.Lock()
		}
		defer f.mu.Unlock()
		return st.temperature, f.answer(st, gpunvml.ReadingTemperature)
	}
	d.GetTemperatureThresholdFunc = func(th nvml.TemperatureThresholds) (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "thresholds"); ret != nvml.SUCCESS {
			return 0, ret
		}
		if th == nvml.TEMPERATURE_THRESHOLD_SLOWDOWN {
			return st.slowdown, nvml.SUCCESS
		}
		return st.shutdown, nvml.SUCCESS
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.powerMw, f.answer(st, gpunvml.ReadingPower)
	}
	d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.limitMw, f.answer(st, gpunvml.ReadingPower)
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.reasons, f.answer(st, gpunvml.ReadingClockEvents)
	}
	// Drivers before 535 name the same bits throttle reasons.
	d.GetCurrentClocksThrottleReasonsFunc = d.GetCurrentClocksEventReasonsFunc
	d.GetPcieReplayCounterFunc = func() (int, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.replays, f.answer(st, gpunvml.ReadingPCIeReplays)
	}
	d.GetFieldValuesFunc = func(values []nvml.FieldValue) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "fieldValues"); ret != nvml.SUCCESS {
			return ret
		}
		for i := range values {
			v := &values[i]
			switch v.FieldId {
			case nvml.FI_DEV_GET_GPU_RECOVERY_ACTION:
				// NVML reports an unsupported field in the field's own return code.
				v.NvmlReturn = uint32(f.answer(st, gpunvml.ReadingRecoveryAction))
				v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
				v.Value = [8]byte{byte(st.recovery)}
			case nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS, nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS:
				// The link is the scope; a link the GPU does not have is an invalid argument.
				counts := st.recoveriesOK
				if v.FieldId == nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS {
					counts = st.recoveriesFailed
				}
				ret := f.answer(st, gpunvml.ReadingNVLinkRecoveries)
				if int(v.ScopeId) >= len(counts) {
					ret = nvml.ERROR_INVALID_ARGUMENT
				}
				v.NvmlReturn, v.ValueType = uint32(ret), uint32(st.recoveryValueType)
				if ret == nvml.SUCCESS {
					binary.NativeEndian.PutUint64(v.Value[:], counts[v.ScopeId])
				}
			default:
				f.t.Errorf("field %d read, want the recovery action or an NVLink recovery count", v.FieldId)
			}
		}
		return nvml.SUCCESS
	}
	f.wireEarlyWarnings(d, st)
}

// wireEarlyWarnings answers the row remapper histogram, SRAM ECC status and PCIe link calls.
func (f *fixture) wireEarlyWarnings(d *server.Device, st *gpuState) {
	d.GetRowRemapperHistogramFunc = func() (nvml.RowRemapperHistogramValues, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingRowRemapHistogram); ret != nvml.SUCCESS {
			return nvml.RowRemapperHistogramValues{}, ret
		}
		if st.mig {
			return nvml.RowRemapperHistogramValues{}, nvml.ERROR_NOT_SUPPORTED
		}
		return st.histogram, nvml.SUCCESS
	}
	d.GetSramEccErrorStatusFunc = func() (nvml.EccSramErrorStatus, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingSRAM); ret != nvml.SUCCESS {
			return nvml.EccSramErrorStatus{}, ret
		}
		return st.sram, nvml.SUCCESS
	}
	pcie := func(v *int, part string) func() (int, nvml.Return) {
		return func() (int, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if ret := f.answer(st, gpunvml.ReadingPCIeLink); ret != nvml.SUCCESS {
				return 0, ret
			}
			return *v, f.answer(st, part)
		}
	}
	d.GetCurrPcieLinkGenerationFunc = pcie(&st.pcieGen, "pcieGen")
	d.GetCurrPcieLinkWidthFunc = pcie(&st.pcieWidth, "pcieWidth")
	d.GetMaxPcieLinkGenerationFunc = pcie(&st.pcieMaxGen, "pcieMaxGen")
	d.GetGpuMaxPcieLinkGenerationFunc = pcie(&st.pcieMaxGen, "pcieMaxGen")
	d.GetMaxPcieLinkWidthFunc = pcie(&st.pcieMaxWidth, "pcieMaxWidth")
}

// fabricInfoV answers the versioned fabric call as a driver that knows versions up to
// maxVersion does (2 or 3; nvml.h: ARGUMENT_VERSION_MISMATCH for a later one).
func (f *fixture) fabricInfoV(maxVersion int) gpunvml.Option {
	return gpunvml.WithFabricInfoV(func(h nvml.Device, version int) (nvml.GpuFabricInfo_v3, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, d := range f.srv.Devices {
			if d != h {
				continue
			}
			st := f.gpus[i]
			if version > maxVersion {
				return nvml.GpuFabricInfo_v3{}, nvml.ERROR_ARGUMENT_VERSION_MISMATCH
			}
			if ret := f.answer(st, "fabric"); ret != nvml.SUCCESS {
				return nvml.GpuFabricInfo_v3{}, ret
			}
			return nvml.GpuFabricInfo_v3{State: st.fabric, Status: st.fabricStatus, HealthMask: st.fabricMask}, nvml.SUCCESS
		}
		f.t.Errorf("fabricInfoV on a handle of no GPU: %v", h)
		return nvml.GpuFabricInfo_v3{}, nvml.ERROR_INVALID_ARGUMENT
	})
}

// wireMemory answers the ECC, row remapper and page retirement calls.
func (f *fixture) wireMemory(d *server.Device, st *gpuState) {
	d.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, counter nvml.EccCounterType) (uint64, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if counter != nvml.VOLATILE_ECC {
			f.t.Errorf("ECC counter type %d read, want volatile", counter)
		}
		if ret := f.answer(st, gpunvml.ReadingECC); ret != nvml.SUCCESS {
			return 0, ret
		}
		if st.eccCurrent != nvml.FEATURE_ENABLED || st.mig {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		if st.eccLowReads > 0 {
			st.eccLowReads--
			return 0, nvml.SUCCESS
		}
		if typ == nvml.MEMORY_ERROR_TYPE_CORRECTED {
			return st.corrected, nvml.SUCCESS
		}
		return st.uncorrected, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingRemappedRows); ret != nvml.SUCCESS {
			return 0, 0, false, false, ret
		}
		if st.mig {
			return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
		}
		return 0, 0, st.rowsPending, st.rowsFailure, nvml.SUCCESS
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingRetiredPages); ret != nvml.SUCCESS {
			return 0, ret
		}
		if st.arch >= nvml.DEVICE_ARCH_AMPERE {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		if st.pagesPending {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
}

// wireNVLink answers the NVLink and fabric calls.
func (f *fixture) wireNVLink(d *server.Device, st *gpuState) {
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingNVLink); ret != nvml.SUCCESS {
			return 0, ret
		}
		if link >= len(st.links) {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return st.links[link], nvml.SUCCESS
	}
	d.GetNvLinkErrorCounterFunc = func(link int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingNVLink); ret != nvml.SUCCESS {
			return 0, ret
		}
		switch c {
		case nvml.NVLINK_ERROR_DL_CRC_FLIT:
			return st.linkErrors[link], nvml.SUCCESS
		case nvml.NVLINK_ERROR_DL_ECC_DATA:
			return st.linkECC[link], f.answer(st, "nvlinkECC")
		}
		return 0, nvml.ERROR_NOT_SUPPORTED // the other counters: no data
	}
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "fabric"); ret != nvml.SUCCESS {
			return nvml.GpuFabricInfo{}, ret
		}
		return nvml.GpuFabricInfo{State: st.fabric, Status: st.fabricStatus}, nvml.SUCCESS
	}
}

// enableMIG puts GPU i in MIG mode with n one-slice instances through the fixture's own MIG
// calls, and serves them as MIG device handles. It returns the MIG devices' UUIDs.
func (f *fixture) enableMIG(i, n int) []string {
	f.t.Helper()
	d := f.device(i)
	f.update(i, func(s *gpuState) { s.mig = true })
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		f.t.Fatalf("SetMigMode: %v", ret)
	}
	giProfile, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		f.t.Fatalf("GetGpuInstanceProfileInfo: %v", ret)
	}
	var migs []nvml.Device
	var uuids []string
	for j := range n {
		gi, ret := d.CreateGpuInstance(&giProfile)
		if ret != nvml.SUCCESS {
			f.t.Fatalf("CreateGpuInstance: %v", ret)
		}
		ciProfile, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			f.t.Fatalf("GetComputeInstanceProfileInfo: %v", ret)
		}
		ci, ret := gi.CreateComputeInstance(&ciProfile)
		if ret != nvml.SUCCESS {
			f.t.Fatalf("CreateComputeInstance: %v", ret)
		}
		giInfo, _ := gi.GetInfo()
		ciInfo, _ := ci.GetInfo()
		uuid := fmt.Sprintf("MIG-%08x-0000-4000-8000-%012x", i, j)
		uuids = append(uuids, uuid)
		migs = append(migs, &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
			GetNameFunc:              func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3 MIG 1g.10gb", nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(giInfo.Id), nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(ciInfo.Id), nvml.SUCCESS },
		})
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return migs[j], nvml.SUCCESS
	}
	return uuids
}
