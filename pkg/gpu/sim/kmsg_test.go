package sim_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Kernel-log lines go through the same parser and mapper as /dev/kmsg in the agent: the
// simulated GPU i sits at PCI 0000:(10+i):00.0.
func TestKmsgEventsFeedTheKernelLogParser(t *testing.T) {
	rec, b := replay(t, scenario("",
		`{at: 1s, kmsg: "NVRM: Xid (PCI:0000:10:00): 79, pid=1234, name=python, GPU has fallen off the bus."}`,
		`{at: 2s, kmsg: "NVRM: Xid (PCI:0000:11:00): 94, pid=4242, name=trainer, Ch 00000008, GPU-I 2, CI 0"}`,
		`{at: 3s, kmsg: "NVRM: Xid (PCI:0000:12:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"}`,
		`{at: 4s, kmsg: "NVRM: GPU 0000:13:00.0: RmInitAdapter failed! (0x24:0x72:1568)"}`,
		// A whole record of facility user (what a process writes to /dev/kmsg) is ignored.
		`{at: 5s, kmsg: "11,900,5000000,-;NVRM: Xid (PCI:0000:12:00): 48, An uncorrectable double bit error"}`,
		// A whole record of the kernel counts, repeat as for any event.
		`{at: 6s, kmsg: "3,901,6000000,-;NVRM: Xid (PCI:0000:12:00): 13, pid=1, name=a, Graphics Exception", repeat: 2}`,
	), sim.Options{})
	var got []string
	lost := map[string]bool{}
	for _, s := range rec.signals {
		switch s.Kind {
		case health.SignalXID:
			scope := "-"
			if s.MIGScoped {
				scope = fmt.Sprintf("gi%d/ci%d", s.GPUInstance, int32(s.ComputeInstance))
			}
			got = append(got, fmt.Sprintf("%v %s xid %d %s", s.Time.Sub(epoch), s.Device, s.XID, scope))
		case health.SignalRecoveryAction:
			if s.Action != health.RecoveryNone {
				got = append(got, fmt.Sprintf("%v %s action %v", s.Time.Sub(epoch), s.Device, s.Action))
			}
		case health.SignalLost:
			// A GPU the log reported lost answers every later sample with lost, as one that
			// NVML reported lost does; the first is what the line caused.
			if !lost[s.Device] {
				got = append(got, fmt.Sprintf("%v %s lost", s.Time.Sub(epoch), s.Device))
			}
			lost[s.Device] = true
		}
	}
	want := []string{
		"1s " + gpu(0) + " xid 79 -",
		"2s " + gpu(1) + " xid 94 gi2/ci0",
		"3s " + gpu(2) + " xid 154 -",
		"3s " + gpu(2) + " action " + health.RecoveryGPUReset.String(),
		"4s " + gpu(3) + " lost",
		"6s " + gpu(2) + " xid 13 -",
		"6s " + gpu(2) + " xid 13 -",
	}
	if !slices.Equal(got, want) {
		t.Errorf("signals\n%q\nwant\n%q", got, want)
	}
	if n := len(rec.of(health.SignalLost, gpu(3))); n < 2 {
		t.Errorf("GPU 3 answered lost %d times, want every sample after the line too", n)
	}
	if b.SpoofedKmsg() != 1 {
		t.Errorf("SpoofedKmsg = %d, want 1", b.SpoofedKmsg())
	}
}

func TestKmsgEventErrorsNameTheLineAndTheProblem(t *testing.T) {
	tests := []struct {
		name  string
		event string
		want  []string
	}{
		{"not NVRM", `{at: 1s, kmsg: "usb 1-1: new device"}`, []string{"line 6", "kmsg", "not an NVRM line"}},
		{"unknown PCI address", `{at: 1s, kmsg: "NVRM: Xid (PCI:0000:99:00): 79, x"}`, []string{"line 6", "0000:99:00.0", "0000:10:00.0"}},
		{"impossible XID", `{at: 1s, kmsg: "NVRM: Xid (PCI:0000:10:00): 0, x"}`, []string{"line 6", "XID 0", "not a valid XID"}},
		{"address too old", `{at: 1s, kmsg: "NVRM: Xid (0009:00): 53, CMDre"}`, []string{"line 6", "too old"}},
		{"unknown UUID", `{at: 1s, kmsg: "NVRM: GPU at PCI:0000:10:00: GPU-nope"}`, []string{"line 6", "GPU-nope"}},
		{"malformed record", `{at: 1s, kmsg: "3,x,1,-;NVRM: Xid (PCI:0000:10:00): 79, x"}`, []string{"line 6", "malformed kmsg record"}},
		{"with a gpu", `{at: 1s, gpu: 0, kmsg: "NVRM: Xid (PCI:0000:10:00): 79, x"}`, []string{"line 6", "remove gpu"}},
		{"with a MIG scope", `{at: 1s, gpuInstance: 1, kmsg: "NVRM: Xid (PCI:0000:10:00): 79, x"}`, []string{"line 6", "own MIG scope"}},
		{"two faults", `{at: 1s, xid: 79, kmsg: "NVRM: Xid (PCI:0000:10:00): 79, x"}`, []string{"line 6", "xid and kmsg"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sim.ParseScenario([]byte(scenario("", tc.event)))
			if err == nil {
				t.Fatal("ParseScenario succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
