package sharedcause

import (
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
