package health_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
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

// fakeBus is n NVIDIA functions as a hostile or broken sysfs lists them.
func fakeBus(n int) []string {
	bus := make([]string, n)
	for i := range bus {
		bus[i] = fmt.Sprintf("0000:%02x:%02x.%d", i>>8, (i>>3)&0x1f, i&7)
	}
	return bus
}

// TestMissingGPUsStopAtMaxGPUs: 4,096 fake NVIDIA functions made 4,096 placeholders, each one
// more entry in the Node's gpu-health annotation, without bound.
func TestMissingGPUsStopAtMaxGPUs(t *testing.T) {
	if health.MaxGPUs != gpuhealthv1.MaxGPUsPerNode {
		t.Fatalf("MaxGPUs %d, but readers count %d GPUs per node", health.MaxGPUs, gpuhealthv1.MaxGPUsPerNode)
	}
	bus := fakeBus(4096)
	opened := []health.Device{
		{UUID: "GPU-a", PCIBusID: "00000000:00:00.0"},
		{UUID: "GPU-b", PCIBusID: "00000000:0F:1F.7"}, // the last of the bus: past the cap
		{UUID: "MIG-a1", MIG: &health.MIGPlacement{ParentUUID: "GPU-a"}},
	}
	for _, tc := range []struct {
		name     string
		devices  []health.Device
		bus      []string
		expected int
		want     int
		first    string
	}{
		{name: "a bus of 4,096", bus: bus, want: health.MaxGPUs, first: "MISSING-0000:00:00.0"},
		{name: "GPUs opened count, MIG instances do not", devices: opened, bus: bus, want: health.MaxGPUs - 2, first: "MISSING-0000:00:00.1"},
		{name: "an expected count past the cap", expected: 4096, want: health.MaxGPUs, first: "MISSING-0"},
		{name: "a bus and an expected count", bus: bus[:10], expected: 4096, want: health.MaxGPUs, first: "MISSING-0000:00:00.0"},
		{name: "the cap itself", bus: bus[:health.MaxGPUs], want: health.MaxGPUs, first: "MISSING-0000:00:00.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := health.MissingGPUs(tc.devices, tc.bus, tc.expected)
			if len(got) != tc.want {
				t.Fatalf("%d placeholders, want %d", len(got), tc.want)
			}
			if got[0].UUID != tc.first {
				t.Errorf("first placeholder %s, want %s", got[0].UUID, tc.first)
			}
		})
	}
	full := make([]health.Device, health.MaxGPUs)
	for i := range full {
		full[i] = health.Device{UUID: fmt.Sprintf("GPU-%d", i), PCIBusID: bus[i]}
	}
	if got := health.MissingGPUs(full, bus, 0); len(got) != 0 {
		t.Errorf("a node with MaxGPUs GPUs opened: %d placeholders", len(got))
	}
}

// TestMaxGPUsPlaceholdersFitTheNodesAnnotations: the cap is there so that the report of a node
// whose bus lists thousands of fakes can still be written (1,024 placeholders: some 154 kB).
func TestMaxGPUsPlaceholdersFitTheNodesAnnotations(t *testing.T) {
	const nodeAnnotationsLimit = 256 << 10 // the API server's bound on a Node's annotations, all together
	missing := health.MissingGPUs(nil, fakeBus(4096), 0)
	tr, err := health.NewTracker(health.DefaultPolicy(), missing)
	if err != nil {
		t.Fatal(err)
	}
	tr.Tick(at(0), nil)
	b, err := json.Marshal(gpuhealthv1.Summaries(tr.Snapshot()))
	if err != nil {
		t.Fatal(err)
	}
	// The Node's other annotations (Volcano's, HAMi's, the heartbeat, other tools') need room too.
	if room := nodeAnnotationsLimit - 64<<10; len(b) > room {
		t.Errorf("the gpu-health annotation of %d placeholders is %d bytes, more than the %d a Node's annotations can spare", len(missing), len(b), room)
	}
}
