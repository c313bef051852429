package nvml

import (
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Optional NVML functions, named by the C symbol go-nvml calls. go-nvml binds libnvidia-ml's
// symbols lazily: calling a function that the installed library lacks is not
// ERROR_FUNCTION_NOT_FOUND but a "symbol lookup error" from the dynamic loader, which ends the
// process. So Open looks every optional function up once (nvml.ExtendedInterface.LookupSymbol)
// and the backend never calls a missing one. The core functions (nvmlInit_v2,
// nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetUUID, nvmlDeviceGetName, ...)
// are in every driver NVML still supports and are not looked up.
const (
	symTotalEccErrors        = "nvmlDeviceGetTotalEccErrors"
	symEccMode               = "nvmlDeviceGetEccMode"
	symRemappedRows          = "nvmlDeviceGetRemappedRows"
	symRetiredPagesPending   = "nvmlDeviceGetRetiredPagesPendingStatus"
	symTemperature           = "nvmlDeviceGetTemperature"
	symTemperatureThreshold  = "nvmlDeviceGetTemperatureThreshold"
	symPowerUsage            = "nvmlDeviceGetPowerUsage"
	symEnforcedPowerLimit    = "nvmlDeviceGetEnforcedPowerLimit"
	symClocksEventReasons    = "nvmlDeviceGetCurrentClocksEventReasons" // driver 535 and later
	symClocksThrottleReasons = "nvmlDeviceGetCurrentClocksThrottleReasons"
	symPcieReplayCounter     = "nvmlDeviceGetPcieReplayCounter"
	symNvLinkState           = "nvmlDeviceGetNvLinkState"
	symNvLinkErrorCounter    = "nvmlDeviceGetNvLinkErrorCounter"
	symFieldValues           = "nvmlDeviceGetFieldValues"
	symArchitecture          = "nvmlDeviceGetArchitecture" // R450 and later, like Ampere
	// The board serial: in every branch NVML supports, but only an attribute, so a library
	// without it (a partial or stub one) costs the serial and nothing else.
	symSerial = "nvmlDeviceGetSerial"
	// The VBIOS version: likewise in every branch, likewise only an attribute.
	symVBIOS = "nvmlDeviceGetVbiosVersion"
	// The fabric state: the versioned call (driver 550 and later) adds the health mask; the
	// plain one (525 and later) answers state and status only.
	symGpuFabricInfoV = "nvmlDeviceGetGpuFabricInfoV"
	symGpuFabricInfo  = "nvmlDeviceGetGpuFabricInfo"
	// The early warnings (earlywarnings.go).
	symRowRemapperHistogram     = "nvmlDeviceGetRowRemapperHistogram"
	symSramEccErrorStatus       = "nvmlDeviceGetSramEccErrorStatus" // driver 535 and later
	symCurrPcieLinkGeneration   = "nvmlDeviceGetCurrPcieLinkGeneration"
	symCurrPcieLinkWidth        = "nvmlDeviceGetCurrPcieLinkWidth"
	symMaxPcieLinkGeneration    = "nvmlDeviceGetMaxPcieLinkGeneration"
	symGpuMaxPcieLinkGeneration = "nvmlDeviceGetGpuMaxPcieLinkGeneration" // 525 and later
	symMaxPcieLinkWidth         = "nvmlDeviceGetMaxPcieLinkWidth"

	symMigMode                = "nvmlDeviceGetMigMode"
	symMaxMigDeviceCount      = "nvmlDeviceGetMaxMigDeviceCount"
	symMigDeviceHandleByIndex = "nvmlDeviceGetMigDeviceHandleByIndex"
	symGpuInstanceID          = "nvmlDeviceGetGpuInstanceId"
	symComputeInstanceID      = "nvmlDeviceGetComputeInstanceId"

	symEventSetCreate      = "nvmlEventSetCreate"
	symEventSetWait        = "nvmlEventSetWait" // go-nvml calls nvmlEventSetWait_v2 where it exists
	symEventSetWaitV2      = "nvmlEventSetWait_v2"
	symEventSetFree        = "nvmlEventSetFree"
	symSupportedEventTypes = "nvmlDeviceGetSupportedEventTypes"
	symRegisterEvents      = "nvmlDeviceRegisterEvents"
)

// readingFunc names the NVML functions one reading can use (any one of them will do; the
// first present is preferred) and the check the reading feeds ("" for none).
type readingFunc struct {
	reading string
	check   health.Check
	anyOf   []string
}

// readingFuncs lists every sampled reading, in sampling order.
var readingFuncs = []readingFunc{
	{ReadingECC, health.CheckECC, []string{symTotalEccErrors}},
	{ReadingRemappedRows, health.CheckRowRemap, []string{symRemappedRows}},
	{ReadingRowRemapHistogram, health.CheckRowRemapHistogram, []string{symRowRemapperHistogram}},
	{ReadingSRAM, health.CheckSRAM, []string{symSramEccErrorStatus}},
	{ReadingRetiredPages, health.CheckRetiredPages, []string{symRetiredPagesPending}},
	{ReadingTemperature, health.CheckThermal, []string{symTemperature}},
	{ReadingPower, "", []string{symPowerUsage}},
	{ReadingClockEvents, health.CheckClockEvents, []string{symClocksEventReasons, symClocksThrottleReasons}},
	{ReadingPCIeReplays, health.CheckPCIeReplays, []string{symPcieReplayCounter}},
	// The current generation and width are the reading; the maximums, looked up on their own,
	// are what it is compared with.
	{ReadingPCIeLink, health.CheckPCIeLink, []string{symCurrPcieLinkWidth}},
	{ReadingFabric, health.CheckFabric, []string{symGpuFabricInfoV, symGpuFabricInfo}},
	{ReadingNVLink, health.CheckNVLink, []string{symNvLinkState}},
	{ReadingNVLinkRecoveries, health.CheckNVLinkRecoveries, []string{symFieldValues}},
	{ReadingRecoveryAction, health.CheckRecoveryAction, []string{symFieldValues}},
}

// checkOf returns the check a reading feeds ("" for none).
func checkOf(reading string) health.Check {
	for _, f := range readingFuncs {
		if f.reading == reading {
			return f.check
		}
	}
	return ""
}

// Groups of functions that only work together.
var (
	migSymbols   = []string{symMigMode, symMaxMigDeviceCount, symMigDeviceHandleByIndex, symGpuInstanceID, symComputeInstanceID}
	eventSymbols = []string{symEventSetCreate, symEventSetFree, symSupportedEventTypes, symRegisterEvents}
	// Looked up on their own: one missing leaves the rest of a reading working.
	partSymbols = []string{symEccMode, symTemperatureThreshold, symEnforcedPowerLimit, symNvLinkErrorCounter, symEventSetWait, symEventSetWaitV2,
		symArchitecture, symSerial, symVBIOS, symCurrPcieLinkGeneration, symMaxPcieLinkGeneration, symGpuMaxPcieLinkGeneration, symMaxPcieLinkWidth}
)

// symbols records which optional NVML functions the loaded library lacks.
type symbols struct {
	missing map[string]bool
}

// lookupSymbols asks the library, once, for every optional function. A library that offers no
// way to ask (Extensions returns nil) is taken to have them all.
func lookupSymbols(lib nvml.Interface) symbols {
	s := symbols{missing: map[string]bool{}}
	ext := lib.Extensions()
	if ext == nil {
		return s
	}
	for _, name := range optionalSymbols() {
		if err := ext.LookupSymbol(name); err != nil {
			s.missing[name] = true
		}
	}
	return s
}

// optionalSymbols lists every optional function the backend may call, each once.
func optionalSymbols() []string {
	var all []string
	for _, f := range readingFuncs {
		all = append(all, f.anyOf...)
	}
	all = append(append(append(all, migSymbols...), eventSymbols...), partSymbols...)
	seen := map[string]bool{}
	return slices.DeleteFunc(all, func(name string) bool {
		dup := seen[name]
		seen[name] = true
		return dup
	})
}

// has reports whether the library has the function.
func (s symbols) has(name string) bool { return !s.missing[name] }

// hasAll reports whether the library has every one of the functions.
func (s symbols) hasAll(names []string) bool {
	for _, n := range names {
		if s.missing[n] {
			return false
		}
	}
	return true
}

// hasAny reports whether the library has at least one of the functions.
func (s symbols) hasAny(names []string) bool {
	for _, n := range names {
		if !s.missing[n] {
			return true
		}
	}
	return false
}

// lacking says which functions of names the library lacks, for messages.
func (s symbols) lacking(names []string) string {
	var out []string
	for _, n := range names {
		if s.missing[n] {
			out = append(out, n)
		}
	}
	return "the driver's NVML library has no " + strings.Join(out, " or ")
}

// eventsMissing says why events cannot be watched with this library ("" when they can).
func (s symbols) eventsMissing() string {
	if !s.hasAll(eventSymbols) {
		return s.lacking(eventSymbols)
	}
	if !s.has(symEventSetWait) && !s.has(symEventSetWaitV2) {
		return s.lacking([]string{symEventSetWait, symEventSetWaitV2})
	}
	return ""
}

// readingsOff returns the readings that the library lacks every function for, and why.
func (s symbols) readingsOff() map[string]string {
	off := map[string]string{}
	for _, f := range readingFuncs {
		if !s.hasAny(f.anyOf) {
			off[f.reading] = s.lacking(f.anyOf)
		}
	}
	return off
}
