package nvsentinel_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/nvsentineltest"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// devices returns n GPUs as NVML names them (PCI 00000000:1<i>:00.0), for the node n1.
func devices(n int) []health.Device {
	out := make([]health.Device, n)
	for i := range out {
		out[i] = health.Device{UUID: fmt.Sprintf("GPU-%d", i), Index: i, PCIBusID: fmt.Sprintf("00000000:%X:00.0", 0x10+i), Minor: i}
	}
	return out
}

// snap returns a snapshot of devs with the conditions conds[uuid].
func snap(devs []health.Device, conds map[string][]health.Condition) health.Snapshot {
	s := health.Snapshot{Time: t0}
	for _, d := range devs {
		st := health.DeviceStatus{Device: d, Conditions: conds[d.UUID]}
		for _, c := range st.Conditions {
			st.Health = max(st.Health, c.Severity)
		}
		s.Devices = append(s.Devices, st)
	}
	return s
}

func xid(code uint32, sev health.Severity, action health.Action) health.Condition {
	return health.Condition{Type: health.ConditionXID, Code: code, Severity: sev, Reason: fmt.Sprintf("XID%d", code),
		Message: fmt.Sprintf("XID %d", code), Since: t0, RecommendedAction: action}
}

func cond(t health.ConditionType, sev health.Severity, action health.Action) health.Condition {
	return health.Condition{Type: t, Severity: sev, Reason: string(t), Message: "seen", Since: t0, RecommendedAction: action}
}

// describe is nvsentineltest.Describe, with what every event of node n1 must carry checked.
func describe(ev *datamodels.HealthEvent) string {
	s := nvsentineltest.Describe(ev)
	if ev.Agent != nvsentinel.Agent || ev.ComponentClass != "GPU" || ev.Version != 1 || ev.NodeName != "n1" ||
		ev.ProcessingStrategy != datamodels.ProcessingStrategy_EXECUTE_REMEDIATION {
		s += fmt.Sprintf(" BAD HEADER %q %q %d %q %v", ev.Agent, ev.ComponentClass, ev.Version, ev.NodeName, ev.ProcessingStrategy)
	}
	return s
}

func describeFaults(fs []nvsentinel.Fault) []string {
	var out []string
	for _, f := range fs {
		out = append(out, describe(f.Event))
	}
	return out
}

func TestFaults(t *testing.T) {
	devs := devices(6)
	mig := health.Device{UUID: "MIG-5a", Index: 5, PCIBusID: devs[5].PCIBusID, MIG: &health.MIGPlacement{ParentUUID: "GPU-5", GPUInstance: 1, ComputeInstance: 0}}
	missing := health.Device{UUID: "MISSING-0000:3b:00.0", Index: -1, Minor: -1, PCIBusID: "0000:3b:00.0", Missing: true}
	gpu3 := "[GPU:3 PCI:0000:13:00 GPU_UUID:GPU-3]"
	gpu5 := "[GPU:5 PCI:0000:15:00 GPU_UUID:GPU-5]"
	for _, tc := range []struct {
		name  string
		devs  []health.Device
		conds map[string][]health.Condition
		opts  nvsentinel.MapOptions
		want  []string
	}{
		{
			name:  "XID 79 asks for a reboot of the bare-metal node",
			conds: map[string][]health.Condition{"GPU-3": {xid(79, health.Unhealthy, health.ActionRebootNode)}},
			want:  []string{"fatal GpuHealthXID [79] " + gpu3 + " RESTART_BM"},
		},
		{
			name:  "in a virtual machine, a reboot is RESTART_VM",
			conds: map[string][]health.Condition{"GPU-3": {xid(79, health.Unhealthy, health.ActionRebootNode)}},
			opts:  nvsentinel.MapOptions{RebootAction: datamodels.RecommendedAction_RESTART_VM},
			want:  []string{"fatal GpuHealthXID [79] " + gpu3 + " RESTART_VM"},
		},
		{
			name:  "a DBE is a memory fault a GPU reset repairs",
			conds: map[string][]health.Condition{"GPU-5": {cond(health.ConditionECCUncorrected, health.Unhealthy, health.ActionResetGPU)}},
			want:  []string{"fatal GpuHealthMemory [ECCUncorrected] " + gpu5 + " COMPONENT_RESET"},
		},
		{
			name:  "Degraded is not fatal and asks for nothing",
			conds: map[string][]health.Condition{"GPU-1": {cond(health.ConditionThermal, health.Degraded, health.ActionCheckCooling)}},
			want:  []string{"non-fatal GpuHealthThermal [Thermal] [GPU:1 PCI:0000:11:00 GPU_UUID:GPU-1] NONE"},
		},
		{
			name: "a GPU gpuhealth repairs asks NVSentinel for nothing and to skip the drain; the others keep their action",
			conds: map[string][]health.Condition{
				"GPU-3": {xid(79, health.Unhealthy, health.ActionRebootNode)},
				"GPU-5": {xid(48, health.Unhealthy, health.ActionResetGPU)},
			},
			opts: nvsentinel.MapOptions{Repairing: func(d health.DeviceStatus) bool { return d.Device.UUID == "GPU-5" }},
			want: []string{"fatal GpuHealthXID [79] " + gpu3 + " RESTART_BM", "fatal GpuHealthXID [48] " + gpu5 + " NONE drain-skip"},
		},
		{
			name: "a MIG instance's fault names its GPU; its parent's, inherited, is sent once",
			devs: append(devices(6), mig),
			conds: map[string][]health.Condition{
				"GPU-5":  {xid(48, health.Unhealthy, health.ActionResetGPU)},
				"MIG-5a": {xid(94, health.Degraded, health.ActionRestartApplication), xid(48, health.Unhealthy, health.ActionResetGPU)},
			},
			want: []string{"fatal GpuHealthXID [48] " + gpu5 + " COMPONENT_RESET", "non-fatal GpuHealthXID [94] " + gpu5 + " NONE"},
		},
		{
			name:  "conditions of one key merge into the worst",
			conds: map[string][]health.Condition{"GPU-3": {xid(13, health.Degraded, health.ActionInspect), {Type: health.ConditionXID, Code: 13, Severity: health.Unhealthy, Reason: "x", Since: t0.Add(time.Hour), RecommendedAction: health.ActionResetGPU}}},
			want:  []string{"fatal GpuHealthXID [13] " + gpu3 + " COMPONENT_RESET"},
		},
		{
			name: "a repeat rule's code is its name, a link's condition names the link, an unknown type is Other, a drain is not sent",
			conds: map[string][]health.Condition{"GPU-3": {
				{Type: health.ConditionXIDRepeat, Code: 2, Severity: health.Degraded, Reason: "RepeatedXID31OnSameGPU", RecommendedAction: health.ActionInspect},
				{Type: health.ConditionNVLinkDown, Code: 2, Severity: health.Unhealthy, Reason: "NVLinkDown", RecommendedAction: health.ActionResetGPU},
				cond("SomethingNew", health.Unhealthy, "doSomethingNew"),
				cond(health.ConditionAdmin, health.Unhealthy, health.ActionNone),
			}},
			want: []string{
				"fatal GpuHealthNVLink [NVLinkDown-link2] " + gpu3 + " COMPONENT_RESET",
				"fatal GpuHealthOther [SomethingNew] " + gpu3 + " CONTACT_SUPPORT",
				"non-fatal GpuHealthXID [RepeatedXID31OnSameGPU] " + gpu3 + " NONE",
			},
		},
		{
			name:  "a missing GPU is named by its address and placeholder; NVSentinel cannot reset it by UUID",
			devs:  append(devices(1), missing),
			conds: map[string][]health.Condition{missing.UUID: {cond(health.ConditionGPUMissing, health.Unhealthy, health.ActionResetGPU)}},
			want:  []string{"fatal GpuHealthMissing [GPUMissing] [PCI:0000:3b:00 GPU_UUID:MISSING-0000:3b:00.0] RESTART_BM"},
		},
		{
			name:  "an embedder's own condition type goes to the check it names",
			conds: map[string][]health.Condition{"GPU-5": {cond("Remediation", health.Unhealthy, health.ActionRebootNode)}},
			opts:  nvsentinel.MapOptions{Checks: map[health.ConditionType]string{"Remediation": nvsentinel.CheckRepair}},
			want:  []string{"fatal GpuHealthRepair [Remediation] " + gpu5 + " RESTART_BM"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := tc.devs
			if ds == nil {
				ds = devs
			}
			tc.opts.NodeName = "n1"
			got := describeFaults(nvsentinel.Faults(snap(ds, tc.conds), tc.opts))
			slices.Sort(got)
			slices.Sort(tc.want)
			if !slices.Equal(got, tc.want) {
				t.Errorf("events\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestEveryEventOfAGPUNamesTheSameEntities: NVSentinel clears by entity, so a fault, its twin and
// the GPU's other faults must name the same three.
func TestEveryEventOfAGPUNamesTheSameEntities(t *testing.T) {
	mig := health.Device{UUID: "MIG-2a", Index: 2, MIG: &health.MIGPlacement{ParentUUID: "GPU-2", GPUInstance: 3}}
	s := snap(append(devices(3), mig), map[string][]health.Condition{
		"GPU-2":  {xid(79, health.Unhealthy, health.ActionRebootNode), cond(health.ConditionThermal, health.Degraded, health.ActionCheckCooling)},
		"MIG-2a": {xid(94, health.Unhealthy, health.ActionResetGPU)},
	})
	faults := nvsentinel.Faults(s, nvsentinel.MapOptions{NodeName: "n1"})
	if len(faults) != 3 {
		t.Fatalf("%d faults, want 3: %q", len(faults), describeFaults(faults))
	}
	want := describe(faults[0].Event)
	want = want[strings.Index(want, "[GPU"):strings.LastIndex(want, "]")]
	for _, f := range faults {
		for _, ev := range []*datamodels.HealthEvent{f.Event, nvsentinel.Twin(f.Event)} {
			if got := describe(ev); !strings.Contains(got, want) {
				t.Errorf("%s names other entities than %s", got, want)
			}
		}
	}
	if got := faults[2].Event.Metadata[nvsentinel.MetaMIG]; faults[2].Key.Code != "94" || got != "MIG-2a" {
		t.Errorf("the MIG instance's fault %s: metadata mig %q, want MIG-2a", faults[2].Key, got)
	}
}

func TestTwin(t *testing.T) {
	faults := nvsentinel.Faults(snap(devices(6), map[string][]health.Condition{"GPU-5": {cond(health.ConditionECCUncorrected, health.Unhealthy, health.ActionResetGPU)}}), nvsentinel.MapOptions{NodeName: "n1"})
	tw := nvsentinel.Twin(faults[0].Event)
	if got, want := describe(tw), "healthy GpuHealthMemory [ECCUncorrected] [GPU:5 PCI:0000:15:00 GPU_UUID:GPU-5] NONE"; got != want {
		t.Errorf("twin %s, want %s", got, want)
	}
	if tw.DrainOverrides != nil || tw.QuarantineOverrides != nil || !strings.Contains(tw.Message, "no longer in effect") {
		t.Errorf("twin overrides %v %v, message %q", tw.DrainOverrides, tw.QuarantineOverrides, tw.Message)
	}
}

func TestAction(t *testing.T) {
	bm := datamodels.RecommendedAction_RESTART_BM
	for _, tc := range []struct {
		action   health.Action
		realUUID bool
		want     datamodels.RecommendedAction
	}{
		{health.ActionResetGPU, true, datamodels.RecommendedAction_COMPONENT_RESET},
		{health.ActionDrainAndResetGPU, true, datamodels.RecommendedAction_COMPONENT_RESET},
		{health.ActionResetBus, true, datamodels.RecommendedAction_COMPONENT_RESET},
		{health.ActionResetGPU, false, bm},
		{health.ActionRebootNode, true, bm},
		{health.ActionRecoverIMEXDomain, true, bm},
		{health.ActionReplaceGPU, true, datamodels.RecommendedAction_CONTACT_SUPPORT},
		{health.ActionReplaceSoon, true, datamodels.RecommendedAction_CONTACT_SUPPORT},
		{health.ActionCheckHardware, true, datamodels.RecommendedAction_CONTACT_SUPPORT},
		{health.ActionCheckCooling, true, datamodels.RecommendedAction_CONTACT_SUPPORT},
		{health.ActionInspect, true, datamodels.RecommendedAction_CONTACT_SUPPORT},
		{"somethingNew", true, datamodels.RecommendedAction_CONTACT_SUPPORT},
		{health.ActionNone, true, datamodels.RecommendedAction_NONE},
		{health.ActionRestartApplication, true, datamodels.RecommendedAction_NONE},
		{health.ActionDrainP2P, true, datamodels.RecommendedAction_NONE},
	} {
		if got := nvsentinel.Action(tc.action, tc.realUUID, bm); got != tc.want {
			t.Errorf("Action(%s, realUUID %v) = %s, want %s", tc.action, tc.realUUID, got, tc.want)
		}
	}
}

// TestEveryBuiltInConditionHasAFamily: a condition type of the library's that falls to
// GpuHealthOther is one this package forgot.
func TestEveryBuiltInConditionHasAFamily(t *testing.T) {
	for _, ct := range []health.ConditionType{
		health.ConditionXID, health.ConditionXIDRepeat, health.ConditionGPULost, health.ConditionGPUMissing, health.ConditionGPUResetRequired,
		health.ConditionECCUncorrected, health.ConditionECCCorrectedStorm, health.ConditionRowRemapFailure, health.ConditionRowRemapPending,
		health.ConditionRetiredPagesPending, health.ConditionThermal, health.ConditionClockThrottle, health.ConditionPCIeReplayRate,
		health.ConditionNVLinkDown, health.ConditionNVLinkErrorRate, health.ConditionRecoveryAction, health.ConditionFabricRegistration,
		health.ConditionFabricHealth, health.ConditionRowRemapAvailability, health.ConditionSRAMThreshold, health.ConditionPCIeLinkDegraded,
		health.ConditionNVLinkRecoveries, health.ConditionReplaceGPU,
	} {
		if name, ok := nvsentinel.CheckName(ct, nil); !ok || name == nvsentinel.CheckOther || !slices.Contains(nvsentinel.Checks(), name) {
			t.Errorf("condition %s: check %q (sent %v)", ct, name, ok)
		}
	}
}

func TestRebootActionFor(t *testing.T) {
	for _, tc := range []struct {
		cpuinfo string
		want    datamodels.RecommendedAction
	}{
		{"processor\t: 0\nflags\t\t: fpu vme de pse hypervisor lahf_lm\n", datamodels.RecommendedAction_RESTART_VM},
		{"processor\t: 0\nflags\t\t: fpu vme de pse lahf_lm\n", datamodels.RecommendedAction_RESTART_BM},
		{"model name\t: hypervisor-lookalike\n", datamodels.RecommendedAction_RESTART_BM},
		{"", datamodels.RecommendedAction_RESTART_BM},
	} {
		if got := nvsentinel.RebootActionFor(strings.NewReader(tc.cpuinfo)); got != tc.want {
			t.Errorf("RebootActionFor(%q) = %s, want %s", tc.cpuinfo, got, tc.want)
		}
	}
}

// TestAGPUsFaultIsItsOwnWhateverTheOrder: a MIG instance repeats its GPU's conditions; the GPU's
// fault is not the instance's, even when a snapshot lists the instance first.
func TestAGPUsFaultIsItsOwnWhateverTheOrder(t *testing.T) {
	gpuFault := xid(79, health.Unhealthy, health.ActionRebootNode)
	mig := health.Device{UUID: "MIG-0a", MIG: &health.MIGPlacement{ParentUUID: "GPU-0", GPUInstance: 1}}
	s := snap([]health.Device{mig, devices(1)[0]}, map[string][]health.Condition{"GPU-0": {gpuFault}, "MIG-0a": {gpuFault}})
	faults := nvsentinel.Faults(s, nvsentinel.MapOptions{NodeName: "n1"})
	if len(faults) != 1 {
		t.Fatalf("%d faults, want 1: %q", len(faults), describeFaults(faults))
	}
	if got := faults[0].Event.Metadata[nvsentinel.MetaMIG]; got != "" || strings.Contains(faults[0].Event.Message, "MIG") {
		t.Errorf("the GPU's fault is attributed to MIG instance %q: %s", got, faults[0].Event.Message)
	}
}

// A fault an agent rebuilt from its Node's report after a restart without a checkpoint reads as
// the fault before the restart: NVSentinel keeps one entry per distinct text, so the restore's
// note would make it a second entry of the same GPU and code.
func TestARestoredFaultKeepsItsText(t *testing.T) {
	devs := devices(4)
	before := xid(79, health.Unhealthy, health.ActionRebootNode)
	restored := before
	restored.Message += health.RestoredFromReportNote
	msg := func(c health.Condition) string {
		fs := nvsentinel.Faults(snap(devs, map[string][]health.Condition{"GPU-3": {c}}), nvsentinel.MapOptions{NodeName: "n1"})
		if len(fs) != 1 {
			t.Fatalf("%d faults, want 1", len(fs))
		}
		return fs[0].Event.Message
	}
	if a, b := msg(before), msg(restored); a != b || strings.Contains(b, "restored") {
		t.Errorf("the restored fault reads %q, before the restart %q", b, a)
	}
}
