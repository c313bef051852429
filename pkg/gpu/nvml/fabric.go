package nvml

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// FabricReading is the GPU's NVLink fabric registration with Fabric Manager (Hopper and later
// in NVSwitch systems), as nvmlDeviceGetGpuFabricInfoV reports it, or, on drivers before it,
// nvmlDeviceGetGpuFabricInfo, which has no health mask.
type FabricReading struct {
	// State is NVML_GPU_FABRIC_STATE_*: 1 not started, 2 in progress, 3 completed.
	State uint8 `json:"state"`
	// Status is the registration's result once State is completed: 0 (NVML_SUCCESS), or the
	// nvmlReturn_t it failed with.
	Status uint32 `json:"status"`
	// HealthMask is the versioned call's NVML_GPU_FABRIC_HEALTH_MASK_* bits; absent when the
	// driver has only the plain call. The flags below are decoded from it.
	HealthMask            *uint32 `json:"healthMask,omitempty"`
	DegradedBandwidth     bool    `json:"degradedBandwidth,omitempty"`
	RouteRecovery         bool    `json:"routeRecovery,omitempty"`
	RouteUnhealthy        bool    `json:"routeUnhealthy,omitempty"`
	AccessTimeoutRecovery bool    `json:"accessTimeoutRecovery,omitempty"`
}

// String renders the reading as probe shows it: "completed, status Success (0), health:
// degradedBandwidth", or "in progress" (no status before completion), with "no health mask" from
// the plain call.
func (f FabricReading) String() string {
	states := [...]string{"not supported", "not started", "in progress", "completed"}
	state := fmt.Sprintf("state %d", f.State)
	if int(f.State) < len(states) {
		state = states[f.State]
	}
	if f.State == nvml.GPU_FABRIC_STATE_COMPLETED {
		state += ", status " + returnName(nvml.Return(f.Status))
	}
	if f.HealthMask == nil {
		return state + ", no health mask (a driver before 550)"
	}
	var flags []string
	for _, fl := range [...]struct {
		set  bool
		name string
	}{{f.DegradedBandwidth, "degradedBandwidth"}, {f.RouteRecovery, "routeRecovery"}, {f.RouteUnhealthy, "routeUnhealthy"}, {f.AccessTimeoutRecovery, "accessTimeoutRecovery"}} {
		if fl.set {
			flags = append(flags, fl.name)
		}
	}
	if len(flags) == 0 {
		flags = []string{"healthy"}
	}
	return state + ", health: " + strings.Join(flags, ", ")
}

// waiting reports whether Fabric Manager has not finished registering the GPU: its NVLinks are
// not trained yet.
func (f *FabricReading) waiting() bool {
	return f != nil && (f.State == nvml.GPU_FABRIC_STATE_NOT_STARTED || f.State == nvml.GPU_FABRIC_STATE_IN_PROGRESS)
}

// health is the reading as the library takes it.
func (f FabricReading) health() health.FabricReading {
	return health.FabricReading{
		State: health.FabricState(f.State), Status: f.Status,
		DegradedBandwidth: f.DegradedBandwidth, RouteRecovery: f.RouteRecovery,
		RouteUnhealthy: f.RouteUnhealthy, AccessTimeoutRecovery: f.AccessTimeoutRecovery,
	}
}

// fabricInfoVFunc makes the versioned fabric call with a struct of the given version (2 or 3).
// ok is false when the handle cannot be asked this way: the plain call is made instead.
type fabricInfoVFunc func(h nvml.Device, version int) (info nvml.GpuFabricInfo_v3, ret nvml.Return, ok bool)

// goNVMLPackage is the package of go-nvml's own device handles.
var goNVMLPackage = reflect.TypeFor[nvml.GpuFabricInfoHandler]().PkgPath()

// goNVMLFabricInfoV makes the versioned call through go-nvml. Its GpuFabricInfoHandler holds
// go-nvml's own C handle, so only such a handle can be asked: a mocked device (a type of
// another package) answers the plain call.
func goNVMLFabricInfoV(h nvml.Device, version int) (nvml.GpuFabricInfo_v3, nvml.Return, bool) {
	t := reflect.TypeOf(h)
	if t == nil || t.PkgPath() != goNVMLPackage {
		return nvml.GpuFabricInfo_v3{}, nvml.ERROR_FUNCTION_NOT_FOUND, false
	}
	if version == 2 {
		v2, ret := h.GetGpuFabricInfoV().V2()
		return nvml.GpuFabricInfo_v3{Status: v2.Status, State: v2.State, HealthMask: v2.HealthMask}, ret, true
	}
	v3, ret := h.GetGpuFabricInfoV().V3()
	return v3, ret, true
}

// readFabric reads the GPU's fabric registration: the versioned call with nvmlGpuFabricInfo_v3
// where the driver has it (v2 when the driver refuses v3 as a version it does not know), else the
// plain call. The NVLinks' wait for Fabric Manager (trackedLinks) reuses this reading. A GPU
// outside an NVLink fabric answers NOT_SUPPORTED, or state NOT_SUPPORTED: its fabric check does
// not run. A state NVML does not define is not believed.
func (b *Backend) readFabric(g *gpu, rd reader) error {
	if rd.off(g, ReadingFabric) {
		return nil
	}
	info, ret := b.fabricInfo(g)
	ok, err := rd.check(ReadingFabric, ret)
	switch {
	case err != nil:
		return err
	case !ok:
		if notSupported(ret) {
			rd.checked(health.CheckFabric, true)
		}
		return nil
	case info.State == nvml.GPU_FABRIC_STATE_NOT_SUPPORTED:
		rd.r.Unsupported = append(rd.r.Unsupported, ReadingFabric)
		rd.checked(health.CheckFabric, true)
		return nil
	case info.State > nvml.GPU_FABRIC_STATE_COMPLETED:
		b.implausible(rd, ReadingFabric, health.CheckFabric, fmt.Sprintf("state %d is none of NVML's", info.State))
		return nil
	}
	rd.r.Fabric = &info
	rd.checked(health.CheckFabric, false)
	return nil
}

// fabricInfo makes the fabric call the driver has.
func (b *Backend) fabricInfo(g *gpu) (FabricReading, nvml.Return) {
	if b.sym.has(symGpuFabricInfoV) {
		v, ret, ok := b.opts.fabricInfoV(g.handle, 3)
		if ok && ret == nvml.ERROR_ARGUMENT_VERSION_MISMATCH {
			v, ret, ok = b.opts.fabricInfoV(g.handle, 2)
		}
		if ok {
			mask := v.HealthMask
			f := FabricReading{State: v.State, Status: v.Status, HealthMask: &mask}
			f.DegradedBandwidth = fabricHealth(mask, nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW) == nvml.GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
			f.RouteRecovery = fabricHealth(mask, nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_RECOVERY) == nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_TRUE
			f.RouteUnhealthy = fabricHealth(mask, nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_UNHEALTHY) == nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
			f.AccessTimeoutRecovery = fabricHealth(mask, nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_ACCESS_TIMEOUT_RECOVERY) == nvml.GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_TRUE
			return f, ret
		}
	}
	if !b.sym.has(symGpuFabricInfo) {
		return FabricReading{}, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	info, ret := g.handle.GetGpuFabricInfo()
	return FabricReading{State: info.State, Status: info.Status}, ret
}

// fabricHealth is nvml.h's NVML_GPU_FABRIC_HEALTH_GET: one field of the health mask. Each field
// is 0 (not supported), 1 (TRUE: the condition holds) or 2 (FALSE).
func fabricHealth(mask uint32, shift, width int) uint32 {
	return mask >> uint(shift) & uint32(width)
}
