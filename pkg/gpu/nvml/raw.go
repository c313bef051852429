package nvml

import (
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// RawCall is one NVML call as the driver answered it: `gpuhealth probe --raw` prints them so a
// real driver's answers can be compared with what the mock fixtures assume.
type RawCall struct {
	// GPU is the index of the GPU asked; absent for calls about the library.
	GPU *int `json:"gpu,omitempty"`
	// Call is the C function; Args says what was asked.
	Call string `json:"call"`
	Args string `json:"args,omitempty"`
	// Return is NVML's answer, its text and code ("Success (0)", "Not Supported (3)": a real
	// library words it, the mock says "ERROR_NOT_SUPPORTED"); for a symbol lookup, "present" or
	// "missing".
	Return string `json:"return"`
	// Value is what the call returned when it succeeded.
	Value any `json:"value,omitempty"`
}

// rawWaitMs is how long RawCalls waits on an event set: the answer expected from a healthy idle
// GPU is ERROR_TIMEOUT.
const rawWaitMs = 100

// RawCalls makes every NVML call the backend depends on once per GPU and records each answer,
// without interpreting it. Functions the library lacks are reported missing and never called
// (calling one would end the process). It registers no events with the GPUs; the event set it
// waits on holds none and is freed.
func (b *Backend) RawCalls() []RawCall {
	var calls []RawCall
	canLookUp := b.lib.Extensions() != nil
	for _, name := range optionalSymbols() {
		found := "present"
		switch {
		case !canLookUp:
			found = "unknown (the library offers no symbol lookup)"
		case !b.sym.has(name):
			found = "missing"
		}
		calls = append(calls, RawCall{Call: "LookupSymbol", Args: name, Return: found})
	}
	version, ret := b.lib.SystemGetDriverVersion()
	calls = append(calls, raw(nil, "nvmlSystemGetDriverVersion", "", ret, version))
	for _, g := range b.gpus {
		calls = append(calls, b.rawGPU(g)...)
	}
	if b.sym.hasAll([]string{symEventSetCreate, symEventSetFree}) && (b.sym.has(symEventSetWait) || b.sym.has(symEventSetWaitV2)) {
		set, ret := b.lib.EventSetCreate()
		calls = append(calls, raw(nil, "nvmlEventSetCreate", "", ret, nil))
		if ret == nvml.SUCCESS {
			_, ret := set.Wait(rawWaitMs)
			calls = append(calls, raw(nil, "nvmlEventSetWait", "empty set, 100 ms (a healthy idle GPU answers ERROR_TIMEOUT)", ret, nil))
			calls = append(calls, raw(nil, "nvmlEventSetFree", "", set.Free(), nil))
		}
	}
	return calls
}

// rawAdd records one call's answer.
type rawAdd func(call, args string, ret nvml.Return, value any)

// rawGPU makes the per-GPU calls, in the order the backend first makes them.
func (b *Backend) rawGPU(g *gpu) []RawCall {
	idx := g.dev.Index
	at := &idx
	var calls []RawCall
	add := func(call, args string, ret nvml.Return, value any) {
		calls = append(calls, raw(at, call, args, ret, value))
	}
	b.rawIdentity(g, add)
	b.rawMemory(g, add)
	b.rawSensors(g, add)
	b.rawRecoveryAction(g, add)
	b.rawEarlyWarnings(g, add)
	b.rawFabric(g, add)
	b.rawNVLinks(g, add)
	return calls
}

// rawIdentity makes the calls that say what the GPU is: UUID, PCI address, name, architecture,
// MIG mode and the events it supports.
func (b *Backend) rawIdentity(g *gpu, add rawAdd) {
	h, has := g.handle, b.sym.has
	uuid, ret := h.GetUUID()
	add("nvmlDeviceGetUUID", "", ret, uuid)
	pci, ret := h.GetPciInfo()
	add("nvmlDeviceGetPciInfo", "", ret, busID(pci))
	name, ret := h.GetName()
	add("nvmlDeviceGetName", "", ret, name)
	if has(symArchitecture) {
		arch, ret := h.GetArchitecture()
		add(symArchitecture, "", ret, arch)
	}
	if has(symMigMode) {
		current, pending, ret := h.GetMigMode()
		add(symMigMode, "", ret, map[string]int{"current": current, "pending": pending})
	}
	if has(symSupportedEventTypes) {
		mask, ret := h.GetSupportedEventTypes()
		add(symSupportedEventTypes, "", ret, map[string]any{"mask": mask, "names": EventNames(mask)})
	}
}

// rawMemory makes the calls of the memory's health: ECC mode and counters, remapped rows,
// retired pages.
func (b *Backend) rawMemory(g *gpu, add rawAdd) {
	h, has := g.handle, b.sym.has
	if has(symEccMode) {
		current, pending, ret := h.GetEccMode()
		add(symEccMode, "", ret, map[string]int{"current": int(current), "pending": int(pending)})
	}
	if has(symTotalEccErrors) {
		for _, c := range []struct {
			args    string
			errType nvml.MemoryErrorType
			counter nvml.EccCounterType
		}{
			{"corrected, volatile", nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC},
			{"uncorrected, volatile", nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC},
		} {
			v, ret := h.GetTotalEccErrors(c.errType, c.counter)
			add(symTotalEccErrors, c.args, ret, v)
		}
	}
	if has(symRemappedRows) {
		corrected, uncorrected, pending, failure, ret := h.GetRemappedRows()
		add(symRemappedRows, "", ret, map[string]any{"corrected": corrected, "uncorrected": uncorrected, "pending": pending, "failure": failure})
	}
	if has(symRetiredPagesPending) {
		state, ret := h.GetRetiredPagesPendingStatus()
		add(symRetiredPagesPending, "", ret, int(state))
	}
}

// rawSensors makes the calls of the polled sensors: temperature and its thresholds, power and
// its limit, clock-event reasons, PCIe replays.
func (b *Backend) rawSensors(g *gpu, add rawAdd) {
	h, has := g.handle, b.sym.has
	if has(symTemperature) {
		v, ret := h.GetTemperature(nvml.TEMPERATURE_GPU)
		add(symTemperature, "GPU", ret, v)
	}
	if has(symTemperatureThreshold) {
		for _, th := range []struct {
			args  string
			which nvml.TemperatureThresholds
		}{
			{"slowdown", nvml.TEMPERATURE_THRESHOLD_SLOWDOWN},
			{"shutdown", nvml.TEMPERATURE_THRESHOLD_SHUTDOWN},
			{"GPU max", nvml.TEMPERATURE_THRESHOLD_GPU_MAX},
		} {
			v, ret := h.GetTemperatureThreshold(th.which)
			add(symTemperatureThreshold, th.args, ret, v)
		}
	}
	if has(symPowerUsage) {
		v, ret := h.GetPowerUsage()
		add(symPowerUsage, "mW", ret, v)
	}
	if has(symEnforcedPowerLimit) {
		v, ret := h.GetEnforcedPowerLimit()
		add(symEnforcedPowerLimit, "mW", ret, v)
	}
	if has(symClocksEventReasons) {
		v, ret := h.GetCurrentClocksEventReasons()
		add(symClocksEventReasons, "", ret, v)
	} else if has(symClocksThrottleReasons) {
		v, ret := h.GetCurrentClocksThrottleReasons()
		add(symClocksThrottleReasons, "", ret, v)
	}
	if has(symPcieReplayCounter) {
		v, ret := h.GetPcieReplayCounter()
		add(symPcieReplayCounter, "", ret, v)
	}
}

// rawRecoveryAction reads the driver's recovery action, a field value.
func (b *Backend) rawRecoveryAction(g *gpu, add rawAdd) {
	if !b.sym.has(symFieldValues) {
		return
	}
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	ret := g.handle.GetFieldValues(values)
	var value any
	if ret == nvml.SUCCESS {
		value = map[string]any{"nvmlReturn": nvml.Return(values[0].NvmlReturn).String(), "valueType": values[0].ValueType, "value": values[0].Value}
	}
	add(symFieldValues, "FI_DEV_GET_GPU_RECOVERY_ACTION (field 230)", ret, value)
}

// rawFabric makes the calls of the NVLink fabric registration, each version of the struct the
// library takes.
func (b *Backend) rawFabric(g *gpu, add rawAdd) {
	h, has := g.handle, b.sym.has
	if has(symGpuFabricInfoV) {
		for _, version := range []int{3, 2} {
			info, ret, ok := b.opts.fabricInfoV(h, version)
			if !ok {
				break
			}
			add(symGpuFabricInfoV, fmt.Sprintf("nvmlGpuFabricInfo_v%d", version), ret, map[string]any{
				"state": info.State, "status": nvml.Return(info.Status).String(), "healthMask": fmt.Sprintf("0x%x", info.HealthMask), "healthSummary": info.HealthSummary,
			})
		}
	}
	if has(symGpuFabricInfo) {
		info, ret := h.GetGpuFabricInfo()
		add(symGpuFabricInfo, "", ret, map[string]any{"state": info.State, "status": nvml.Return(info.Status).String()})
	}
}

// rawNVLinks reads each link's state up to the GPU's last, then the links' recovery counts.
func (b *Backend) rawNVLinks(g *gpu, add rawAdd) {
	h, has := g.handle, b.sym.has
	links := 0
	if has(symNvLinkState) {
		for link := range nvml.NVLINK_MAX_LINKS {
			state, ret := h.GetNvLinkState(link)
			add(symNvLinkState, "link "+strconv.Itoa(link), ret, int(state))
			if ret != nvml.SUCCESS {
				break // past the GPU's last link every later one answers the same
			}
			links++
		}
	}
	if has(symFieldValues) && links > 0 {
		var values []nvml.FieldValue
		for link := range links {
			for _, id := range nvlinkRecoveryFields {
				values = append(values, nvml.FieldValue{FieldId: id, ScopeId: uint32(link)})
			}
		}
		ret := h.GetFieldValues(values)
		var answers []map[string]any
		for _, v := range values {
			n, _ := fieldValue(v)
			answers = append(answers, map[string]any{"field": v.FieldId, "link": v.ScopeId, "nvmlReturn": nvml.Return(v.NvmlReturn).String(), "valueType": v.ValueType, "value": n})
		}
		add(symFieldValues, fmt.Sprintf("NVLink recovery events, successful and failed (fields %d and %d), links 0-%d", nvlinkRecoveryFields[0], nvlinkRecoveryFields[1], links-1), ret, answers)
	}
}

// rawEarlyWarnings makes the calls of the early-warning readings.
func (b *Backend) rawEarlyWarnings(g *gpu, add rawAdd) {
	h, has := g.handle, b.sym.has
	if has(symRowRemapperHistogram) {
		v, ret := h.GetRowRemapperHistogram()
		add(symRowRemapperHistogram, "", ret, map[string]uint32{"max": v.Max, "high": v.High, "partial": v.Partial, "low": v.Low, "none": v.None})
	}
	if has(symSramEccErrorStatus) {
		v, ret := h.GetSramEccErrorStatus()
		add(symSramEccErrorStatus, "nvmlEccSramErrorStatus_v1", ret, map[string]any{
			"bThresholdExceeded": v.BThresholdExceeded, "aggregateUncParity": v.AggregateUncParity, "aggregateUncSecDed": v.AggregateUncSecDed, "aggregateCor": v.AggregateCor,
		})
	}
	for _, c := range []struct {
		sym  string
		call func() (int, nvml.Return)
	}{
		{symCurrPcieLinkGeneration, h.GetCurrPcieLinkGeneration},
		{symCurrPcieLinkWidth, h.GetCurrPcieLinkWidth},
		{symMaxPcieLinkGeneration, h.GetMaxPcieLinkGeneration},
		{symGpuMaxPcieLinkGeneration, h.GetGpuMaxPcieLinkGeneration},
		{symMaxPcieLinkWidth, h.GetMaxPcieLinkWidth},
	} {
		if has(c.sym) {
			v, ret := c.call()
			add(c.sym, "", ret, v)
		}
	}
}

// raw builds a RawCall; the value only counts when the call succeeded.
func raw(gpu *int, call, args string, ret nvml.Return, value any) RawCall {
	c := RawCall{GPU: gpu, Call: call, Args: args, Return: returnName(ret)}
	if ret == nvml.SUCCESS {
		c.Value = value
	}
	return c
}

// returnName is NVML's text for ret with its code, which is the same on every library.
func returnName(ret nvml.Return) string {
	return ret.Error() + " (" + strconv.Itoa(int(ret)) + ")"
}
