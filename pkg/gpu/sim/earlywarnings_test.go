package sim_test

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The early warnings in the scenario format: the fabric registration (a state, or state, status
// and health flags), the row remapper histogram, the SRAM ECC threshold, the PCIe link and NVLink
// recoveries. The sim backend answers them all (none is for the simulated driver only).

func TestEarlyWarningEvents(t *testing.T) {
	cases := []struct {
		name  string
		event string
		want  sim.Event
	}{
		{"fabric state", "{at: 1s, gpu: 2, fabric: inProgress}",
			sim.Event{Kind: sim.EventFabric, GPU: 2, Fabric: health.FabricReading{State: health.FabricInProgress}}},
		{"fabric failed", "{at: 1s, gpu: 2, fabric: {state: completed, status: 999}}",
			sim.Event{Kind: sim.EventFabric, GPU: 2, Fabric: health.FabricReading{State: health.FabricCompleted, Status: 999}}},
		{"fabric health", "{at: 1s, gpu: 2, fabric: {state: completed, health: [degradedBandwidth, routeRecovery, routeUnhealthy, accessTimeoutRecovery]}}",
			sim.Event{Kind: sim.EventFabric, GPU: 2, Fabric: health.FabricReading{State: health.FabricCompleted,
				DegradedBandwidth: true, RouteRecovery: true, RouteUnhealthy: true, AccessTimeoutRecovery: true}}},
		{"fabric health cleared", "{at: 1s, gpu: 2, fabric: {state: completed, health: []}}",
			sim.Event{Kind: sim.EventFabric, GPU: 2, Fabric: health.FabricReading{State: health.FabricCompleted}}},
		{"histogram", "{at: 1s, gpu: 0, rowRemapHistogram: {low: 3, none: 1}}", sim.Event{Kind: sim.EventRowRemapHistogram, BanksLow: 3, BanksNone: 1}},
		{"histogram, none only", "{at: 1s, gpu: 0, rowRemapHistogram: {none: 2}}", sim.Event{Kind: sim.EventRowRemapHistogram, BanksNone: 2}},
		{"SRAM", "{at: 1s, gpu: 0, sramThresholdExceeded: true}", sim.Event{Kind: sim.EventSRAM, SRAMThresholdExceeded: true}},
		{"PCIe link", "{at: 1s, gpu: 0, pcieLink: {gen: 4, maxGen: 5, width: 8, maxWidth: 16}}",
			sim.Event{Kind: sim.EventPCIeLink, PCIeLink: health.PCIeLinkReading{Gen: 4, MaxGen: 5, Width: 8, MaxWidth: 16}}},
		{"PCIe link, width only", "{at: 1s, gpu: 0, pcieLink: {width: 4}}", sim.Event{Kind: sim.EventPCIeLink, PCIeLink: health.PCIeLinkReading{Width: 4}}},
		{"NVLink recoveries", "{at: 1s, gpu: 0, nvlinkRecoveries: {link: 3, successful: 10, failed: 1}}",
			sim.Event{Kind: sim.EventNVLinkRecoveries, Link: 3, RecoveriesSuccessful: 10, RecoveriesFailed: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sc := mustParseScenario(t, scenario("", tc.event))
			want := tc.want
			want.At, want.Repeat, want.Line = time.Second, 1, 6
			if got := sc.Events[0]; !reflect.DeepEqual(got, want) {
				t.Fatalf("event\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestEarlyWarningEventErrors(t *testing.T) {
	cases := []struct {
		name, event string
		want        []string
	}{
		{"fabric state unknown", "{at: 1s, gpu: 0, fabric: degraded}", []string{"events[0] (line 6)", "fabric: must be one of notStarted, inProgress, completed", `"degraded"`}},
		{"fabric not a state", "{at: 1s, gpu: 0, fabric: 3}", []string{"line 6", "fabric must be a state"}},
		{"fabric a list", "{at: 1s, gpu: 0, fabric: [completed]}", []string{"line 6", "fabric must be a state"}},
		{"fabric without a state", "{at: 1s, gpu: 0, fabric: {status: 3}}", []string{"line 6", "fabric.state: required"}},
		{"fabric unknown field", "{at: 1s, gpu: 0, fabric: {state: completed, clique: 2}}", []string{"line 6", `fabric: unknown field "clique"`}},
		{"fabric field twice", "{at: 1s, gpu: 0, fabric: {state: completed, state: inProgress}}", []string{"line 6", "state given twice"}},
		{"fabric status a fraction", "{at: 1s, gpu: 0, fabric: {state: completed, status: 1.5}}", []string{"line 6", "fabric.status", `"1.5"`}},
		{"fabric status negative", "{at: 1s, gpu: 0, fabric: {state: completed, status: -1}}", []string{"line 6", "fabric.status"}},
		{"fabric status too large", "{at: 1s, gpu: 0, fabric: {state: completed, status: 1000}}", []string{"line 6", "fabric.status", "999"}},
		{"fabric status before completion", "{at: 1s, gpu: 0, fabric: {state: inProgress, status: 3}}", []string{"events[0] (line 6)", "only a completed registration has a status"}},
		{"fabric health unknown", "{at: 1s, gpu: 0, fabric: {state: completed, health: [slow]}}", []string{"line 6", `fabric.health: "slow" is none of`}},
		{"fabric health not a list", "{at: 1s, gpu: 0, fabric: {state: completed, health: degradedBandwidth}}", []string{"line 6", "fabric.health: must be a list"}},
		{"fabric on a MIG instance", "{at: 1s, gpu: MIG-" + sim.MIGUUID("n1", 1, 1)[4:] + ", fabric: completed}", []string{"events[0] (line 6)", "physical GPU"}},
		{"histogram empty", "{at: 1s, gpu: 0, rowRemapHistogram: {}}", []string{"events[0] (line 6)", "rowRemapHistogram: set low or none"}},
		{"histogram unknown field", "{at: 1s, gpu: 0, rowRemapHistogram: {partial: 3}}", []string{"line 6", `unknown field "partial"`}},
		{"histogram too many banks", "{at: 1s, gpu: 0, rowRemapHistogram: {low: 600, none: 41}}", []string{"events[0] (line 6)", "640 banks"}},
		{"histogram negative", "{at: 1s, gpu: 0, rowRemapHistogram: {low: -1}}", []string{"line 6", `"-1"`}},
		{"SRAM not a bool", "{at: 1s, gpu: 0, sramThresholdExceeded: yes please}", []string{"line 6"}},
		{"PCIe link empty", "{at: 1s, gpu: 0, pcieLink: {}}", []string{"events[0] (line 6)", "pcieLink: set gen"}},
		{"PCIe gen 0", "{at: 1s, gpu: 0, pcieLink: {gen: 0}}", []string{"events[0] (line 6)", "pcieLink.gen", "got 0"}},
		{"PCIe gen 7", "{at: 1s, gpu: 0, pcieLink: {maxGen: 7}}", []string{"events[0] (line 6)", "pcieLink.maxGen", "got 7"}},
		{"PCIe width x3", "{at: 1s, gpu: 0, pcieLink: {width: 3}}", []string{"events[0] (line 6)", "pcieLink.width", "got 3"}},
		{"PCIe width above 255", "{at: 1s, gpu: 0, pcieLink: {width: 1024}}", []string{"line 6", `"1024"`}},
		{"PCIe faster than it can", "{at: 1s, gpu: 0, pcieLink: {gen: 5, maxGen: 4}}", []string{"events[0] (line 6)", "more than the most the link can"}},
		{"PCIe wider than it can", "{at: 1s, gpu: 0, pcieLink: {width: 16, maxWidth: 8}}", []string{"events[0] (line 6)", "more than the most the link can"}},
		{"PCIe unknown field", "{at: 1s, gpu: 0, pcieLink: {lanes: 8}}", []string{"line 6", `unknown field "lanes"`}},
		{"recoveries without link", "{at: 1s, gpu: 0, nvlinkRecoveries: {successful: 3}}", []string{"events[0] (line 6)", "nvlinkRecoveries.link: required"}},
		{"recoveries link out of range", "{at: 1s, gpu: 0, nvlinkRecoveries: {link: 18, successful: 3}}", []string{"events[0] (line 6)", "nvlinkRecoveries.link", "18"}},
		{"recoveries without counts", "{at: 1s, gpu: 0, nvlinkRecoveries: {link: 1}}", []string{"events[0] (line 6)", "set successful or failed"}},
		{"recoveries negative", "{at: 1s, gpu: 0, nvlinkRecoveries: {link: 1, failed: -2}}", []string{"line 6", `"-2"`}},
		{"recoveries too many at once", "{at: 1s, gpu: 0, nvlinkRecoveries: {link: 1, successful: 1000001}}", []string{"events[0] (line 6)", "at most 1000000"}},
		{"two early warnings in one event", "{at: 1s, gpu: 0, sramThresholdExceeded: true, pcieLink: {width: 8}}", []string{"events[0] (line 6)", "sramThresholdExceeded and pcieLink in one event"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sim.ParseScenario([]byte(scenario("", tc.event)))
			wantOneLineError(t, err, tc.want...)
		})
	}
}

// The sim backend samples the early warnings of the GPUs the scenario names, from the first
// round, reports a change at once (the recovery counts, as counters, at the next round), and keeps
// what a GPU's hardware keeps (the row remapper's banks, the SRAM threshold) through a reboot.
func TestEarlyWarningsInTheSimBackend(t *testing.T) {
	rec, _ := replay(t, scenario("",
		"{at: 5s, gpu: 0, fabric: {state: completed, status: 999}}",
		"{at: 5s, gpu: 1, rowRemapHistogram: {low: 2, none: 1}}",
		"{at: 5s, gpu: 2, sramThresholdExceeded: true}",
		"{at: 5s, gpu: 3, pcieLink: {width: 8}}",
		"{at: 5s, gpu: 3, nvlinkRecoveries: {link: 4, successful: 3, failed: 2}}",
		"{at: 25s, reboot: true}",
	)+"duration: 40s\n", sim.Options{})

	at := func(s health.Signal) time.Duration { return s.Time.Sub(epoch) }
	fabric := rec.of(health.SignalFabric, gpu(0))
	if len(fabric) < 3 || fabric[0].Fabric != (health.FabricReading{State: health.FabricCompleted}) || at(fabric[1]) != 5*time.Second ||
		fabric[1].Fabric.Status != 999 {
		t.Errorf("GPU 0 fabric %+v: want completed from the first round, then status 999 at 5s", fabric)
	}
	if last := fabric[len(fabric)-1]; last.Fabric.Status != 0 {
		t.Errorf("GPU 0 fabric after the reboot %+v, want registered again", last.Fabric)
	}
	hist := rec.of(health.SignalRowRemapHistogram, gpu(1))
	if len(hist) < 3 || hist[0].BanksLow != 0 || hist[1].BanksLow != 2 || hist[1].BanksNone != 1 || hist[len(hist)-1].BanksNone != 1 {
		t.Errorf("GPU 1 histogram %+v: want 0 at first, then 2 low and 1 none, kept through the reboot", hist)
	}
	sram := rec.of(health.SignalSRAMThreshold, gpu(2))
	if len(sram) < 3 || sram[0].Failure || !sram[1].Failure || !sram[len(sram)-1].Failure {
		t.Errorf("GPU 2 SRAM %+v: want exceeded from 5s on, through the reboot", sram)
	}
	pcie := rec.of(health.SignalPCIeLink, gpu(3))
	full := health.PCIeLinkReading{Gen: sim.PCIeGen, MaxGen: sim.PCIeGen, Width: sim.PCIeWidth, MaxWidth: sim.PCIeWidth}
	narrow := full
	narrow.Width = 8
	if len(pcie) < 3 || pcie[0].PCIe != full || pcie[1].PCIe != narrow || pcie[len(pcie)-1].PCIe != full {
		t.Errorf("GPU 3 PCIe link %+v: want gen 5 x16, then x8 at 5s, x16 again after the reboot", pcie)
	}
	var counts []int64
	for _, s := range rec.of(health.SignalNVLinkRecoveries, gpu(3)) {
		if s.Link != 4 {
			t.Errorf("recoveries of link %d, want link 4 only", s.Link)
		}
		if at(s) <= 20*time.Second {
			counts = append(counts, s.Value)
		}
	}
	if !slices.Equal(counts, []int64{0, 5, 5}) {
		t.Errorf("GPU 3 link 4 recoveries at 0s, 10s, 20s: %v, want [0 5 5] (polled: the round after 5s)", counts)
	}
	for _, kind := range []health.SignalKind{health.SignalFabric, health.SignalRowRemapHistogram, health.SignalSRAMThreshold, health.SignalPCIeLink, health.SignalNVLinkRecoveries} {
		for i := range 4 {
			if n := len(rec.of(kind, gpu(i))); n > 0 && !namesKind(i, kind) {
				t.Errorf("GPU %d, which no event names for it, reports %v %d times", i, kind, n)
			}
		}
	}
}

func namesKind(gpu int, kind health.SignalKind) bool {
	return map[health.SignalKind]int{health.SignalFabric: 0, health.SignalRowRemapHistogram: 1, health.SignalSRAMThreshold: 2,
		health.SignalPCIeLink: 3, health.SignalNVLinkRecoveries: 3}[kind] == gpu
}
