package sim_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// trackerSink feeds a replay into a Tracker and remembers the first error.
type trackerSink struct {
	tr  *health.Tracker
	err error
}

func (s *trackerSink) Signal(sig health.Signal) {
	if _, err := s.tr.Observe(sig, nil); err != nil && s.err == nil {
		s.err = err
	}
}

func (s *trackerSink) Reboot(bootID string, at time.Time) { s.tr.Reboot(bootID, at, nil) }

func (s *trackerSink) SetUnmonitored(uuid string, unmonitored bool) {
	if err := s.tr.SetUnmonitored(uuid, unmonitored); err != nil && s.err == nil {
		s.err = err
	}
}

func (s *trackerSink) SetPeerFaults(faults []health.PeerFault, at time.Time) {
	if _, err := s.tr.SetPeerFaults(faults, at, nil); err != nil && s.err == nil {
		s.err = err
	}
}

// FuzzParseScenario feeds arbitrary bytes to the scenario parser. It must never panic; a
// rejection is one non-empty line; an accepted scenario is sorted, refers only to its own GPUs,
// and (when small) replays through a Tracker without a signal for an unknown device.
func FuzzParseScenario(f *testing.F) {
	for _, p := range []string{filepath.Join("testdata", "issue-example.yaml"), filepath.Join("..", "..", "..", "examples", "scenario.yaml")} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"",
		scenario(""),
		scenario("", "{at: 1s, gpu: 1, xid: 62, gpuInstance: 2, computeInstance: 0}", "{at: 0s, reboot: true}"),
		scenario("", "{at: 1ms, gpu: "+sim.MIGUUID("n1", 1, 1)+", xid: 48, repeat: 3}"),
		scenario("", "{at: 2s, gpu: 0, nvlink: {link: 17, crcErrors: 5}}", "{at: 2s, gpu: 0, nvlink: {link: 0, down: true}}"),
		scenario("", "{at: 3s, gpu: 3, lost: true}", "{at: 4s, gpu: 3, reset: true}", "{at: 5s, gpu: 3, temperatureC: 120}"),
		scenario("", "{at: 1s, gpu: 2, ecc: {correctedVolatile: 18446744073709551615}}", "{at: 2s, gpu: 2, ecc: {correctedVolatile: 1}}"),
		scenario("", "{at: 1s, gpu: 2, pcieReplays: 9223372036854775807}", "{at: 2s, gpu: 2, pcieReplays: 1}"),
		scenario("", "{at: 1s, gpu: 0, clockEventReasons: [hwPowerBrake]}", "{at: 1s, gpu: 0, recoveryAction: drainP2P}", "{at: 1s, gpu: 0, retiredPages: {pending: true}}", "{at: 1s, gpu: 0, remappedRows: {failure: true}}"),
		scenario("", `{at: 1s, kmsg: "NVRM: Xid (PCI:0000:11:00): 94, pid=1, name=a, Ch 00000008, GPU-I 2, CI 0"}`, `{at: 2s, kmsg: "11,5,2000000,-;NVRM: GPU 0000:10:00.0: RmInitAdapter failed! (0x24:0x72:1568)"}`),
		scenario("", "{at: 1s, gpu: 0, fabric: {state: completed, status: 999, health: [degradedBandwidth]}}", "{at: 0s, gpu: 1, fabric: inProgress}",
			"{at: 1s, gpu: 2, rowRemapHistogram: {low: 2, none: 1}}", "{at: 1s, gpu: 3, sramThresholdExceeded: true}",
			"{at: 1s, gpu: 3, pcieLink: {gen: 4, maxGen: 5, width: 8, maxWidth: 16}}", "{at: 2s, gpu: 0, nvlinkRecoveries: {link: 3, successful: 10, failed: 1}}"),
		scenario("") + "duration: 1m\n",
		scenario("", "~", "-"),
		scenarioHeader + "gpus: {count: 64, migInstances: {\"63\": 7}}\n",
		scenarioHeader + "gpus: {count: 1}\nevents: [{at: 5, gpu: 0, xid: 1}]\n",
		scenarioHeader + "gpus: &g {count: 1}\nx: *g\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := sim.ParseScenario(data)
		if err != nil {
			if msg := err.Error(); msg == "" || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("error %q is not one non-empty line", msg)
			}
			return
		}
		if sc.GPUCount < 1 || sc.GPUCount > sim.MaxGPUs {
			t.Fatalf("GPU count %d accepted", sc.GPUCount)
		}
		repeats := 0
		for i, ev := range sc.Events {
			if i > 0 && ev.At < sc.Events[i-1].At {
				t.Fatalf("events not sorted: %v after %v", ev.At, sc.Events[i-1].At)
			}
			if ev.At < 0 || ev.Repeat < 1 || (ev.Kind != sim.EventReboot && ev.Kind != sim.EventPeerFault && (ev.GPU < 0 || ev.GPU >= sc.GPUCount)) {
				t.Fatalf("event %+v accepted", ev)
			}
			if ev.MIG > sc.MIGInstances[ev.GPU] {
				t.Fatalf("event %+v names a MIG instance the GPU does not have", ev)
			}
			repeats += ev.Repeat
		}
		tr, err := health.NewTracker(health.DefaultPolicy(), sc.Devices())
		if err != nil {
			t.Fatalf("devices of an accepted scenario: %v", err)
		}
		if repeats > 1000 || sc.End(30*time.Second) > 2*time.Minute {
			return // too long to replay on every fuzz input
		}
		sink := &trackerSink{tr: tr}
		if err := sim.New(sc, sim.Options{Virtual: true}).Run(context.Background(), sink); err != nil {
			t.Fatal(err)
		}
		if sink.err != nil {
			t.Fatalf("replay: %v", sink.err)
		}
	})
}
