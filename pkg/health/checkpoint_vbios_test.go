package health_test

import (
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// A VBIOS version in a checkpoint is an attribute, as the serial is: a GPU the inventory has
// keeps the version its backend reads (a flashed board reads a new one), and a GPU that vanished
// comes back with the one it had.
func TestCheckpointVBIOSIsAnAttribute(t *testing.T) {
	cp, err := health.UnmarshalCheckpoint(readFixture(t, "checkpoint-v7.json"))
	if err != nil {
		t.Fatal(err)
	}
	flashed := gpuDevice(0)
	flashed.VBIOS = "96.00.99.00.01"
	h, _ := restoreInto(t, health.DefaultPolicy(), cp, fixtureBoot, flashed, gpuDevice(2), migDevice(2, 1, 0), migDevice(2, 2, 0))
	got := map[string]string{}
	for _, d := range h.tr.Snapshot().Devices {
		got[d.Device.UUID] = d.Device.VBIOS
	}
	want := map[string]string{"GPU-0000": "96.00.99.00.01", "GPU-0001": "96.00.89.00.02", "GPU-0002": "",
		"MIG-0002-1-0": "", "MIG-0002-2-0": ""}
	for uuid, v := range want {
		if g, ok := got[uuid]; !ok || g != v {
			t.Errorf("%s: VBIOS %q (present %v), want %q", uuid, g, ok, v)
		}
	}
}
