package sharedcause

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// nodes returns count nodes of perNode GPUs named prefix-N, each GPU with attrs(node index,
// GPU index).
func nodes(prefix string, count, perNode int, attrs func(n, g int) map[string]string) []GPU {
	var gpus []GPU
	for n := range count {
		for g := range perNode {
			node := fmt.Sprintf("%s-%d", prefix, n)
			gpus = append(gpus, GPU{UUID: fmt.Sprintf("GPU-%s-%d", node, g), Node: node, Attributes: attrs(n, g)})
		}
	}
	return gpus
}

func same(attrs map[string]string) func(n, g int) map[string]string {
	return func(int, int) map[string]string { return attrs }
}

// faulty gives each of the GPUs one XID79 a minute ago.
func faulty(gpus []GPU) []Fault {
	var faults []Fault
	for _, g := range gpus {
		faults = append(faults, Fault{GPU: g.UUID, Time: now.Add(-time.Minute), Reason: "XID79"})
	}
	return faults
}

func names(fs []Finding) []string {
	out := []string{}
	for _, f := range fs {
		out = append(out, f.Attribute+"="+f.Value)
	}
	return out
}

// edgeFleet is 100 nodes of 8 GPUs (800) on driver "good"; the first 10 nodes (80 GPUs) run
// driver "bad", and are pool "" (no value) where the rest are pool "p1".
func edgeFleet() []GPU {
	return nodes("n", 100, 8, func(n, _ int) map[string]string {
		if n < 10 {
			return map[string]string{"driver": "bad", "pool": ""}
		}
		return map[string]string{"driver": "good", "pool": "p1"}
	})
}

// everyNth returns every nth GPU of gpus, from the first.
func everyNth(gpus []GPU, n int) []GPU {
	var out []GPU
	for i := 0; i < len(gpus); i += n {
		out = append(out, gpus[i])
	}
	return out
}

func TestJudgeEdges(t *testing.T) {
	oneNode := nodes("solo", 1, 8, func(_, g int) map[string]string {
		vbios := "A"
		if g >= 6 {
			vbios = "B"
		}
		return map[string]string{"driver": "580", "rack": "r1", "vbios": vbios}
	})
	tiny := nodes("t", 100, 8, func(n, g int) map[string]string {
		if n < 2 && g < 2 {
			return map[string]string{"model": "GB200"}
		}
		return map[string]string{"model": "H100"}
	})
	alike := nodes("a", 100, 8, same(map[string]string{"driver": "580", "zone": "z"}))
	tests := []struct {
		name   string
		fleet  Fleet
		opts   Options
		want   []string // the findings, attribute=value, in order
		tested int      // Result.GroupsTested
	}{
		{name: "no GPUs", want: []string{}},
		{name: "one GPU", fleet: Fleet{GPUs: oneNode[:1], Faults: faulty(oneNode[:1])}, want: []string{}},
		{name: "one node, six of its eight GPUs faulty: its groups hold every GPU or one node",
			fleet: Fleet{GPUs: oneNode, Faults: faulty(oneNode[:6])}, want: []string{}, tested: 1},
		{name: "one node, with one faulty node allowed: 6 faulty of 8 is too few to tell (p = 1/28)",
			fleet: Fleet{GPUs: oneNode, Faults: faulty(oneNode[:6])}, opts: Options{MinFaultyNodes: 1},
			want: []string{}, tested: 1},
		{name: "all GPUs alike, half of them faulty",
			fleet: Fleet{GPUs: alike, Faults: faulty(everyNth(alike, 2))}, want: []string{}},
		{name: "a group of 4, all faulty, below MinFaultyGPUs",
			fleet: Fleet{GPUs: tiny, Faults: faulty(tiny[:2])}, want: []string{}, tested: 1},
		{name: "a group of 4, all faulty, MinFaultyGPUs 4",
			fleet: Fleet{GPUs: tiny, Faults: append(faulty(tiny[:2]), faulty(tiny[8:10])...)},
			opts:  Options{MinFaultyGPUs: 4}, want: []string{"model=GB200"}, tested: 2},
		{name: "a rest with no fault, a driver with 8 of 80 faulty; pool without a value is no group",
			fleet: Fleet{GPUs: edgeFleet(), Faults: faulty(everyNth(edgeFleet()[:80], 10))},
			want:  []string{"driver=bad"}, tested: 3},
		{name: "4 of 80 faulty: below MinFaultyGPUs though the rest had none",
			fleet: Fleet{GPUs: edgeFleet(), Faults: faulty(everyNth(edgeFleet()[:80], 20))},
			want:  []string{}, tested: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Judge(now, tc.fleet, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := names(res.SharedCauses); !slices.Equal(got, tc.want) {
				t.Errorf("findings %v, want %v", got, tc.want)
			}
			if res.GroupsTested != tc.tested {
				t.Errorf("%d groups tested, want %d", res.GroupsTested, tc.tested)
			}
		})
	}
}

// TestFindingFigures checks every figure of one finding: driver "bad" (80 GPUs on 10 nodes)
// with 8 faulty GPUs on 8 nodes, one of them with a second fault, and a rest with no fault.
func TestFindingFigures(t *testing.T) {
	gpus := edgeFleet()
	faults := faulty(everyNth(gpus[:80], 10))
	faults = append(faults, Fault{GPU: gpus[0].UUID, Time: now.Add(-40 * time.Minute), Reason: "XID48"})
	res, err := Judge(now, Fleet{GPUs: gpus, Faults: faults}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.SharedCauses) != 1 {
		t.Fatalf("findings %v, want one", names(res.SharedCauses))
	}
	got := res.SharedCauses[0]
	wantRatio := 0.1 / (0.5 / 721)             // the rest's 0 faulty of 720, corrected to 0.5 of 721
	wantP := exactHypergeomTail(8, 800, 8, 80) // all 8 faulty GPUs of the 800 in the group of 80
	if got.PValue < wantP*(1-1e-12) || got.PValue > wantP*(1+1e-12) || got.Ratio < wantRatio*(1-1e-12) || got.Ratio > wantRatio*(1+1e-12) {
		t.Errorf("p %.17g ratio %.17g, want %.17g and %.17g", got.PValue, got.Ratio, wantP, wantRatio)
	}
	got.PValue, got.LogPValue, got.Ratio = 0, 0, 0
	want := Finding{
		Attribute: "driver", Value: "bad", Faults: 9, FaultyGPUs: 8, GPUs: 80, Nodes: 10, FaultyNodes: 8,
		Rate: 0.1, RestRate: 0, Since: now.Add(-40 * time.Minute),
		Reasons: []ReasonCount{{Reason: "XID79", Faults: 8}, {Reason: "XID48", Faults: 1}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("finding\n %+v\nwant\n %+v", got, want)
	}
	if res.GPUs != 800 || res.FaultyGPUs != 8 || res.Faults != 9 || res.FleetRate != 0.01 || res.Threshold != 0.001/3 {
		t.Errorf("result totals %+v", res)
	}
}

// TestNestedFindings: driver "bad" runs on exactly racks r1 and r2, and its wave makes all three
// findings, each with its own figures, the strongest (lowest p) first.
func TestNestedFindings(t *testing.T) {
	gpus := nodes("n", 200, 8, func(n, _ int) map[string]string {
		driver := "good"
		if n < 20 {
			driver = "bad"
		}
		return map[string]string{"driver": driver, "rack": fmt.Sprintf("r%d", n/10+1)}
	})
	faults := append(faulty(everyNth(gpus[:80], 5)), faulty(everyNth(gpus[80:160], 6))...) // 16 in r1, 14 in r2
	faults = append(faults, faulty(everyNth(gpus[160:], 200))...)                          // 8 in the rest
	res, err := Judge(now, Fleet{GPUs: gpus, Faults: faults}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"driver=bad", "rack=r1", "rack=r2"}
	if got := names(res.SharedCauses); !slices.Equal(got, want) {
		t.Fatalf("findings %v, want %v", got, want)
	}
	for i, want := range []struct{ faulty, gpus int }{{30, 160}, {16, 80}, {14, 80}} {
		if f := res.SharedCauses[i]; f.FaultyGPUs != want.faulty || f.GPUs != want.gpus {
			t.Errorf("%s=%s: %d faulty of %d, want %d of %d", f.Attribute, f.Value, f.FaultyGPUs, f.GPUs, want.faulty, want.gpus)
		}
	}
}

// TestIgnoredInput: faults without a time, outside the window or of unknown GPUs, GPUs without
// a UUID and second GPUs of one UUID are left out and counted; a fault at the window's very
// start counts.
func TestIgnoredInput(t *testing.T) {
	gpus := edgeFleet()[:16]
	gpus = append(gpus, GPU{Node: "n-0"}, GPU{UUID: gpus[0].UUID, Node: "elsewhere"})
	faults := []Fault{
		{GPU: gpus[0].UUID, Time: now.Add(-time.Hour), Reason: "XID79"},
		{GPU: gpus[1].UUID, Time: now, Reason: "XID79"},
		{GPU: gpus[2].UUID, Reason: "XID79"},
		{GPU: gpus[3].UUID, Time: now.Add(-time.Hour - time.Nanosecond), Reason: "XID79"},
		{GPU: gpus[4].UUID, Time: now.Add(time.Second), Reason: "XID79"},
		{GPU: "GPU-unknown", Time: now, Reason: "XID79"},
	}
	res, err := Judge(now, Fleet{GPUs: gpus, Faults: faults}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := Ignored{FaultsWithoutTime: 1, FaultsOutsideWindow: 2, FaultsOfUnknownGPUs: 1, GPUsWithoutUUID: 1, DuplicateGPUs: 1}
	if res.Ignored != want || res.GPUs != 16 || res.Faults != 2 || res.FaultyGPUs != 2 {
		t.Errorf("ignored %+v, %d GPUs, %d faults on %d; want %+v, 16 GPUs, 2 faults on 2", res.Ignored, res.GPUs, res.Faults, res.FaultyGPUs, want)
	}
}

// TestJudgeIsDeterministic: the same fleet in another order gives the same result.
func TestJudgeIsDeterministic(t *testing.T) {
	gpus := testFleet()
	rng := rand.New(rand.NewPCG(1, 2))
	faults := append(driverWave(rng, gpus), jobBurst(0, time.Second, nil)...)
	faults = append(faults, faultsOn(rng, pick(rng, gpus[100*8:120*8], 30))...) // a bad rack-05
	fleet := Fleet{GPUs: gpus, Faults: faults, Workloads: jobWorkloads()}
	first, err := Judge(now, fleet, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.SharedCauses) < 2 || len(first.Signatures) != 1 {
		t.Fatalf("want several findings and a signature to order, got %v and %d", names(first.SharedCauses), len(first.Signatures))
	}
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 3))
		shuffled := Fleet{GPUs: slices.Clone(fleet.GPUs), Faults: slices.Clone(fleet.Faults), Workloads: fleet.Workloads}
		rng.Shuffle(len(shuffled.GPUs), func(i, j int) { shuffled.GPUs[i], shuffled.GPUs[j] = shuffled.GPUs[j], shuffled.GPUs[i] })
		rng.Shuffle(len(shuffled.Faults), func(i, j int) { shuffled.Faults[i], shuffled.Faults[j] = shuffled.Faults[j], shuffled.Faults[i] })
		again, err := Judge(now, shuffled, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(first, again) {
			t.Fatalf("shuffle %d: results differ:\n%+v\n%+v", seed, first, again)
		}
	}
}
