package nvsentinel_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/report/nvsentinel"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/nvsentineltest"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// snapshot: GPU 0 with XID 48 (a reset repairs it), GPU 1 with XID 79 (a reboot does).
func snapshot() health.Snapshot {
	s := health.Snapshot{Time: t0}
	for i, c := range []health.Condition{
		{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy, ClearsOn: health.ClearsOnGPUReset, RecommendedAction: health.ActionResetGPU, Reason: "XID48", Since: t0},
		{Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, ClearsOn: health.ClearsOnNodeReboot, RecommendedAction: health.ActionRebootNode, Reason: "XID79", Since: t0},
	} {
		s.Devices = append(s.Devices, health.DeviceStatus{
			Device:     health.Device{UUID: fmt.Sprintf("GPU-%d", i), Index: i, PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x10+i)},
			Health:     health.Unhealthy,
			Conditions: []health.Condition{c},
		})
	}
	return s
}

func TestRepairing(t *testing.T) {
	s := snapshot()
	for _, tc := range []struct {
		name   string
		states map[string]remediation.State
		want   []bool // per GPU
	}{
		{"before the repair: the reset-class fault is remediation's", nil, []bool{true, false}},
		{"on probation after the reset", map[string]remediation.State{"GPU-0": {Phase: remediation.PhaseProbation, Since: t0}}, []bool{true, false}},
		{"being reset", map[string]remediation.State{"GPU-0": {Phase: remediation.PhaseResetting, Since: t0}}, []bool{true, false}},
		{"given up: the reboot is NVSentinel's", map[string]remediation.State{"GPU-0": {Phase: remediation.PhaseFailed, Since: t0}}, []bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := remediation.Decorate(s, tc.states)
			var got []bool
			for _, dev := range d.Devices {
				got = append(got, nvsentinel.Repairing(dev))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("repairing %v, want %v", got, tc.want)
			}
		})
	}
}

// summary is what the tests read of an event.
func summary(ev *datamodels.HealthEvent) string {
	return fmt.Sprintf("%s %v fatal=%v healthy=%v %s skip=%v", ev.CheckName, ev.ErrorCode, ev.IsFatal, ev.IsHealthy, ev.RecommendedAction, ev.DrainOverrides.GetSkip())
}

// TestWhoRepairs sends the same faults under each choice of repairer, through a real server.
func TestWhoRepairs(t *testing.T) {
	probation := map[string]remediation.State{"GPU-0": {Phase: remediation.PhaseProbation, Since: t0}}
	failed := map[string]remediation.State{"GPU-0": {Phase: remediation.PhaseFailed, Since: t0, Message: "3 resets did not help"}}
	for _, tc := range []struct {
		name          string
		repairer      string
		remediationOn bool
		states        map[string]remediation.State
		want          []string
	}{
		{
			name: "gpuhealth repairs the reset-class fault; NVSentinel does the reboot", repairer: config.NVSentinelRemediationGPUHealth, remediationOn: true,
			want: []string{"GpuHealthXID [48] fatal=true healthy=false NONE skip=true", "GpuHealthXID [79] fatal=true healthy=false RESTART_VM skip=false"},
		},
		{
			name: "on probation: the repair shows, still asking for nothing", repairer: config.NVSentinelRemediationGPUHealth, remediationOn: true, states: probation,
			want: []string{"GpuHealthRepair [Remediation] fatal=true healthy=false NONE skip=true", "GpuHealthXID [48] fatal=true healthy=false NONE skip=true", "GpuHealthXID [79] fatal=true healthy=false RESTART_VM skip=false"},
		},
		{
			name: "gpuhealth gave up: NVSentinel gets the reboot and may drain", repairer: config.NVSentinelRemediationGPUHealth, remediationOn: true, states: failed,
			want: []string{"GpuHealthRepair [Remediation] fatal=true healthy=false RESTART_VM skip=false", "GpuHealthXID [48] fatal=true healthy=false COMPONENT_RESET skip=false", "GpuHealthXID [79] fatal=true healthy=false RESTART_VM skip=false"},
		},
		{
			name: "gpuhealth's remediation off: nobody in gpuhealth repairs, NVSentinel may", repairer: config.NVSentinelRemediationGPUHealth,
			want: []string{"GpuHealthXID [48] fatal=true healthy=false COMPONENT_RESET skip=false", "GpuHealthXID [79] fatal=true healthy=false RESTART_VM skip=false"},
		},
		{
			name: "NVSentinel repairs", repairer: config.NVSentinelRemediationNVSentinel,
			want: []string{"GpuHealthXID [48] fatal=true healthy=false COMPONENT_RESET skip=false", "GpuHealthXID [79] fatal=true healthy=false RESTART_VM skip=false"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			socket, cpuinfo := filepath.Join(dir, "nvsentinel.sock"), filepath.Join(dir, "cpuinfo")
			if err := os.WriteFile(cpuinfo, []byte("flags\t\t: fpu hypervisor\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			srv, err := nvsentineltest.Start(socket)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Stop()
			s := nvsentinel.New("n1", nvsentinel.Options{
				Config:             config.NVSentinelConfig{Socket: socket, Remediation: tc.repairer},
				RemediationEnabled: tc.remediationOn, Clock: clocktesting.NewFakeClock(t0), CPUInfo: cpuinfo,
			})
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if err := s.Start(ctx, func() {}); err != nil {
				t.Fatal(err)
			}
			if writes, err := s.Sync(ctx, remediation.Decorate(snapshot(), tc.states)); writes != 0 || err != nil {
				t.Fatalf("Sync: %d writes, %v", writes, err)
			}
			var got []string
			for _, ev := range srv.Events() {
				if !ev.IsHealthy {
					got = append(got, summary(ev))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("received\n %q\nwant\n %q", got, tc.want)
			}
		})
	}
}

// TestSyncNeverFails: without NVSentinel the agent stays ready (Sync succeeds) and the Writer is
// asked back when the retry is due.
func TestSyncNeverFails(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	s := nvsentinel.New("n1", nvsentinel.Options{Config: config.NVSentinelConfig{Socket: filepath.Join(t.TempDir(), "absent.sock"), RebootAction: config.NVSentinelRebootBareMetal}, Clock: clk})
	_, ctx := ktesting.NewTestContext(t)
	if writes, err := s.Sync(ctx, snapshot()); writes != 0 || err != nil {
		t.Fatalf("Sync without a socket: %d writes, %v", writes, err)
	}
	if next := s.NextSync(); next.Before(t0.Add(900*time.Millisecond)) || next.After(t0.Add(1100*time.Millisecond)) {
		t.Errorf("next sync %v after the failure, want the first backoff step (1s ±10%%)", next.Sub(t0))
	}
}
