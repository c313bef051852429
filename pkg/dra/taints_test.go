package dra_test

import (
	"reflect"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

var since = time.Date(2026, 5, 1, 10, 0, 0, 123456789, time.UTC)

func xid(code uint32, sev health.Severity, evict bool) health.Condition {
	return health.Condition{Type: health.ConditionXID, Code: code, Severity: sev, Reason: "XID", Since: since, Evict: evict}
}

func gpuStatus(uuid string, sev health.Severity, conds ...health.Condition) health.DeviceStatus {
	d := health.DeviceStatus{Device: health.Device{UUID: uuid}, Health: sev, Conditions: conds}
	for _, c := range conds {
		d.Evict = d.Evict || c.Evict
	}
	return d
}

func TestTaints(t *testing.T) {
	added := metav1.NewTime(since.Truncate(time.Second))
	devices := map[string]string{"GPU-AAAA": "gpu-0", "gpu-bbbb": "gpu-1", "GPU-cccc": "gpu-2"}
	tests := []struct {
		name string
		snap []health.DeviceStatus
		opts dra.TaintOptions
		want map[string][]resourceapi.DeviceTaint
	}{
		{
			name: "healthy GPUs have no taints",
			snap: []health.DeviceStatus{gpuStatus("GPU-aaaa", health.Healthy)},
			want: map[string][]resourceapi.DeviceTaint{},
		},
		{
			name: "unhealthy is NoSchedule, UUIDs match in any case",
			snap: []health.DeviceStatus{gpuStatus("GPU-aaaa", health.Unhealthy, xid(48, health.Unhealthy, false)), gpuStatus("GPU-BBBB", health.Healthy)},
			want: map[string][]resourceapi.DeviceTaint{"gpu-0": {{Key: "gpuhealth.dev/xid", Value: "48", Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &added}}},
		},
		{
			name: "degraded is None",
			snap: []health.DeviceStatus{gpuStatus("GPU-bbbb", health.Degraded, health.Condition{Type: health.ConditionThermal, Severity: health.Degraded, Reason: "TemperatureAtSlowdown", Since: since})},
			want: map[string][]resourceapi.DeviceTaint{"gpu-1": {{Key: "gpuhealth.dev/thermal", Value: "TemperatureAtSlowdown", Effect: resourceapi.DeviceTaintEffectNone, TimeAdded: &added}}},
		},
		{
			name: "eviction without NoExecute stays NoSchedule",
			snap: []health.DeviceStatus{gpuStatus("GPU-cccc", health.Unhealthy, xid(79, health.Unhealthy, true))},
			want: map[string][]resourceapi.DeviceTaint{"gpu-2": {{Key: "gpuhealth.dev/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &added}}},
		},
		{
			name: "eviction with NoExecute",
			snap: []health.DeviceStatus{gpuStatus("GPU-cccc", health.Unhealthy, xid(79, health.Unhealthy, true))},
			opts: dra.TaintOptions{NoExecute: true},
			want: map[string][]resourceapi.DeviceTaint{"gpu-2": {{Key: "gpuhealth.dev/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoExecute, TimeAdded: &added}}},
		},
		{
			name: "GPUs the driver does not publish are left out",
			snap: []health.DeviceStatus{gpuStatus("GPU-dddd", health.Unhealthy, xid(48, health.Unhealthy, false))},
			want: map[string][]resourceapi.DeviceTaint{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := dra.Taints(health.Snapshot{Devices: tc.snap}, devices, tc.opts)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Taints = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSetTaints(t *testing.T) {
	other := resourceapi.DeviceTaint{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	old := resourceapi.DeviceTaint{Key: "gpuhealth.dev/thermal", Value: "TemperatureAtSlowdown", Effect: resourceapi.DeviceTaintEffectNone}
	now := resourceapi.DeviceTaint{Key: "gpuhealth.dev/xid", Value: "48", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	devs := []resourceapi.Device{
		{Name: "gpu-0", Taints: []resourceapi.DeviceTaint{other, old}},
		{Name: "gpu-1", Taints: []resourceapi.DeviceTaint{old}},
		{Name: "gpu-2"},
		{Name: "gpu-3", Taints: []resourceapi.DeviceTaint{other}},
	}
	dra.SetTaints(devs, map[string][]resourceapi.DeviceTaint{"gpu-0": {now}, "gpu-2": {now}})
	want := [][]resourceapi.DeviceTaint{{other, now}, nil, {now}, {other}}
	for i, d := range devs {
		if !reflect.DeepEqual(d.Taints, want[i]) {
			t.Errorf("%s taints %v, want %v", d.Name, d.Taints, want[i])
		}
	}
}
