package sharedcause

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// seeds is how many fixed seeds the statistical tests run.
const seeds = 200

// TestDriverWaveIsOneFinding: a wave at 20× the rest's rate on one driver version of three is
// one finding, naming it, under every seed.
func TestDriverWaveIsOneFinding(t *testing.T) {
	gpus := testFleet()
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 47))
		res, err := Judge(now, Fleet{GPUs: gpus, Faults: driverWave(rng, gpus)}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.SharedCauses) != 1 {
			t.Fatalf("seed %d: %d findings, want 1: %+v", seed, len(res.SharedCauses), res.SharedCauses)
		}
		f := res.SharedCauses[0]
		if f.Attribute != "driver" || f.Value != "580.95.05" || f.FaultyGPUs != 160 || f.GPUs != 1600 || f.Nodes != 200 {
			t.Fatalf("seed %d: finding %+v, want driver=580.95.05 with 160 faulty of 1600 GPUs on 200 nodes", seed, f)
		}
	}
}

// TestUniformFaultsRaiseNothing: as many faults as the wave's, spread uniformly at random over
// the fleet, raise no finding under any seed. The count of false findings is the figure the
// package comment quotes.
func TestUniformFaultsRaiseNothing(t *testing.T) {
	gpus := testFleet()
	falseFindings, judged := 0, 0
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 47))
		n := len(driverWave(rng, gpus)) // the same number of faults as the wave of this seed
		res, err := Judge(now, Fleet{GPUs: gpus, Faults: uniformFaults(rng, gpus, n)}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		judged += res.GroupsTested
		for _, f := range res.SharedCauses {
			falseFindings++
			t.Errorf("seed %d: false finding %s=%s: %d faulty of %d GPUs, ratio %.1f, p %.3g",
				seed, f.Attribute, f.Value, f.FaultyGPUs, f.GPUs, f.Ratio, f.PValue)
		}
	}
	t.Logf("%d false findings in %d seeds (%d groups tested)", falseFindings, seeds, judged)
}

// TestLopsidedFleetRaisesNothing: most of the fleet is one model (4,560 H100, 240 A100) and every
// GPU fails at the same low rate (1% and 2%, each GPU on its own), so the small rest often has no
// fault at all. A test against the rest's rate as if it were known called the big group bad in 7
// of 200 seeds at 1%; Fisher's exact test, which conditions on the faults of the whole fleet,
// raises nothing.
func TestLopsidedFleetRaisesNothing(t *testing.T) {
	var gpus []GPU
	for i := range testNodes {
		model := "H100"
		if i >= 570 {
			model = "A100"
		}
		for g := range testGPUsPerNode {
			gpus = append(gpus, GPU{UUID: testUUID(i, g), Node: testNode(i), Attributes: map[string]string{"model": model, "rack": fmt.Sprintf("rack-%02d", i/20)}})
		}
	}
	for _, rate := range []float64{0.01, 0.02} {
		falseFindings := 0
		for seed := range uint64(seeds) {
			rng := rand.New(rand.NewPCG(seed, 1748))
			var faults []Fault
			for _, g := range gpus {
				if rng.Float64() < rate {
					faults = append(faults, Fault{GPU: g.UUID, Time: randomTime(rng), Reason: "XID79"})
				}
			}
			res, err := Judge(now, Fleet{GPUs: gpus, Faults: faults}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range res.SharedCauses {
				falseFindings++
				t.Errorf("rate %g, seed %d: false finding %s=%s: %d faulty of %d GPUs, ratio %.1f, p %.3g",
					rate, seed, f.Attribute, f.Value, f.FaultyGPUs, f.GPUs, f.Ratio, f.PValue)
			}
		}
		t.Logf("rate %g: %d false findings in %d seeds", rate, falseFindings, seeds)
	}
}
