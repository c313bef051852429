package health_test

import (
	"slices"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestMissingGPUs(t *testing.T) {
	devs := []health.Device{
		{UUID: "GPU-a", Index: 0, PCIBusID: "00000000:1A:00.0"},
		{UUID: "GPU-b", Index: 1, PCIBusID: "00000000:3B:00.0"},
		{UUID: "MIG-b1", Index: 1, MIG: &health.MIGPlacement{ParentUUID: "GPU-b"}},
	}
	bus := []string{"0000:1a:00.0", "0000:3b:00.0", "0000:5e:00.0", "garbage"}
	got := health.MissingGPUs(devs, bus, 0)
	if len(got) != 1 || got[0].UUID != "MISSING-0000:5e:00.0" || got[0].PCIBusID != "0000:5e:00.0" || got[0].Index != -1 || !got[0].Missing {
		t.Fatalf("MissingGPUs = %+v, want the GPU at 0000:5e:00.0", got)
	}
	// An expected count beyond what the bus shows adds placeholders by ordinal.
	got = health.MissingGPUs(devs, bus, 5)
	var uuids []string
	for _, d := range got {
		uuids = append(uuids, d.UUID)
	}
	if want := []string{"MISSING-0000:5e:00.0", "MISSING-3", "MISSING-4"}; !slices.Equal(uuids, want) {
		t.Errorf("with 5 expected: %v, want %v", uuids, want)
	}
	if got := health.MissingGPUs(devs, []string{"0000:1a:00.0"}, 2); len(got) != 0 {
		t.Errorf("nothing missing: %+v", got)
	}
}

func TestAMissingGPUIsUnhealthyAndTheNodeBelowCapacity(t *testing.T) {
	devs := []health.Device{gpuDevice(0), gpuDevice(1)}
	missing := health.MissingGPUs(devs, []string{"0000:00:00.0", "0000:01:00.0", "0000:07:00.0"}, 0)
	h := newHarness(t, health.DefaultPolicy(), append(devs, missing...)...)
	// Raised the first time the tracker learns the time, which is then its Since.
	if st := h.status("MISSING-0000:07:00.0"); st.Health != health.Healthy {
		t.Fatalf("placeholder before any time is known: %+v", st)
	}
	out := h.tick(0)
	wantTransitions(t, out, tr("MISSING-0000:07:00.0", health.Healthy, health.Unhealthy, health.ReasonGPUMissing))
	st := h.status("MISSING-0000:07:00.0")
	if !st.Conditions[0].Since.Equal(at(0)) {
		t.Errorf("since %v, want the first tick", st.Conditions[0].Since)
	}
	if st.Health != health.Unhealthy || len(st.Conditions) != 1 || st.Conditions[0].Reason != health.ReasonGPUMissing ||
		st.Conditions[0].ClearsOn != health.ClearsOnRecovered {
		t.Fatalf("placeholder %+v, want Unhealthy GPUMissing, not sticky", st)
	}
	f := h.tr.Snapshot().Findings
	if len(f) != 1 || f[0].Reason != health.ReasonBelowCapacity || f[0].Message != "the node runs 2 of its 3 GPUs: MISSING-0000:07:00.0 missing" {
		t.Fatalf("findings %+v", f)
	}
	// Signals about it (a kernel-log line naming its address) are kept against it.
	h.xid("MISSING-0000:07:00.0", 79, time.Second)
	if _, ok := h.condition("MISSING-0000:07:00.0", health.ConditionXID, 79); !ok {
		t.Error("an XID on the missing GPU was not kept")
	}
	// The finding outlasts every window, and a reboot does not bring the GPU back.
	h.tick(48 * time.Hour)
	h.reboot("boot-2", 49*time.Hour)
	if st := h.status("MISSING-0000:07:00.0"); st.Health != health.Unhealthy {
		t.Errorf("after a reboot the placeholder is %v", st.Health)
	}
	if f := h.tr.Snapshot().Findings; len(f) != 1 {
		t.Errorf("findings after a reboot %+v", f)
	}
	// Its GPUMissing is never checkpointed.
	for _, d := range h.tr.Checkpoint().Devices {
		for _, c := range d.Conditions {
			if c.Type == health.ConditionGPUMissing {
				t.Errorf("checkpoint holds %+v", c)
			}
		}
	}
}
