package health_test

import (
	"slices"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// A board serial in a checkpoint is an attribute, as the model is: devices are matched by UUID,
// a GPU the inventory has keeps the serial its backend reads (the checkpoint's, older or
// different, changes nothing), and a GPU that vanished comes back with the one it had.
func TestCheckpointSerialIsAnAttribute(t *testing.T) {
	withSerial := func(d health.Device, serial string) health.Device {
		d.Serial = serial
		return d
	}
	cases := []struct {
		name    string
		fixture string
		devices []health.Device
		// want is each GPU's serial after the restore, by UUID.
		want map[string]string
	}{
		{
			name:    "a checkpoint without serials, a backend with them",
			fixture: "checkpoint-v5.json",
			devices: []health.Device{withSerial(gpuDevice(0), "B0"), withSerial(gpuDevice(1), "B1"), gpuDevice(2), migDevice(2, 1, 0), migDevice(2, 2, 0)},
			want:    map[string]string{"GPU-0000": "B0", "GPU-0001": "B1", "GPU-0002": ""},
		},
		{
			name:    "serials that differ from the backend's, or that it cannot read",
			fixture: "checkpoint-v6.json",
			devices: []health.Device{withSerial(gpuDevice(0), "B0"), gpuDevice(1), gpuDevice(2), migDevice(2, 1, 0), migDevice(2, 2, 0)},
			want:    map[string]string{"GPU-0000": "B0", "GPU-0001": "", "GPU-0002": ""},
		},
		{
			name:    "a GPU that vanished keeps its serial",
			fixture: "checkpoint-v6.json",
			devices: []health.Device{withSerial(gpuDevice(0), "1650923012340"), gpuDevice(2), migDevice(2, 1, 0), migDevice(2, 2, 0)},
			want:    map[string]string{"GPU-0000": "1650923012340", "GPU-0001": "1650923012341", "GPU-0002": ""},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp, err := health.UnmarshalCheckpoint(readFixture(t, tc.fixture))
			if err != nil {
				t.Fatal(err)
			}
			h, _ := restoreInto(t, health.DefaultPolicy(), cp, fixtureBoot, tc.devices...)
			got := map[string]string{}
			for _, d := range h.tr.Snapshot().Devices {
				if d.Device.MIG != nil {
					if d.Device.Serial != "" {
						t.Errorf("MIG instance %s has serial %q", d.Device.UUID, d.Device.Serial)
					}
					continue
				}
				got[d.Device.UUID] = d.Device.Serial
			}
			for uuid, serial := range tc.want {
				if s, ok := got[uuid]; !ok || s != serial {
					t.Errorf("%s: serial %q (present %v), want %q", uuid, s, ok, serial)
				}
			}
			if faults := faultList(h.tr); !slices.Equal(faults, currentFaults()) {
				t.Errorf("restored faults\n got %q\nwant %q", faults, currentFaults())
			}
		})
	}
}
