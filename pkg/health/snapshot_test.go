package health_test

import (
	"slices"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestSnapshotUnhealthyGPUs(t *testing.T) {
	snap := health.Snapshot{Devices: []health.DeviceStatus{
		{Device: health.Device{UUID: "GPU-healthy"}, Health: health.Healthy},
		{Device: health.Device{UUID: "GPU-degraded"}, Health: health.Degraded},
		{Device: health.Device{UUID: "GPU-sick"}, Health: health.Unhealthy},
		{Device: health.Device{UUID: "MIG-sick", MIG: &health.MIGPlacement{ParentUUID: "GPU-healthy"}}, Health: health.Unhealthy},
		{Device: health.Device{UUID: "GPU-missing", Index: -1, Missing: true}, Health: health.Unhealthy},
		{Device: health.Device{UUID: "GPU-sick-too", Index: 3}, Health: health.Unhealthy},
	}}
	var got []string
	for _, d := range snap.UnhealthyGPUs() {
		got = append(got, d.Device.UUID)
	}
	if want := []string{"GPU-sick", "GPU-sick-too"}; !slices.Equal(got, want) {
		t.Errorf("UnhealthyGPUs() = %v, want %v (physical, present, Unhealthy, in order)", got, want)
	}
}
