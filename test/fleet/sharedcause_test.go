//go:build e2e

package fleet

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	fleetcollect "github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// TestFleetSharedCause runs the shared-cause judge (issue 47) over GPUHEALTH_FLEET_NODES (at least
// 500) nodes × 8 GPUs on the real API server, every node labelled (three drivers, three zones,
// 4-node NVLink domains, 20-node racks) and its gpu-health annotation written as its agent writes
// it (judged_test.go). Under each of GPUHEALTH_FLEET_SEEDS seeds (default 5; seed s is
// math/rand/v2's PCG(s, 47), logged):
//
//   - a wave on driver 580.95.05 at 20× the rest's rate (one in ten of its GPUs faulty, one in
//     200 of the others; a faulty GPU failed once, or failed, was reset and failed again) is
//     exactly one finding, naming the driver, with its counts;
//   - the same number of faulty GPUs spread uniformly at random is no finding: every finding is
//     a false one, and the test fails unless there are none.
//
// Each scenario patches the nodes whose report changes, then lists Nodes and running pods in
// pages and judges; the figures (findings, p-values, list and judge times) are logged.
func TestFleetSharedCause(t *testing.T) {
	size := judgedFleetSize(t)
	seeds := envInt(t, "GPUHEALTH_FLEET_SEEDS", 5)
	_, admin := quietCluster(t)
	ctx := t.Context()
	fleet := makeFleet(size)
	labelFleet(fleet)
	policy := health.DefaultPolicy()
	healthy, err := reports(policy, fleet, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep := &reporter{admin: admin}
	start := time.Now()
	if err := rep.create(ctx, fleet, healthy); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes (%d GPUs) created with their agents' reports in %.1fs", size, size*gpusPerNode, time.Since(start).Seconds())

	all := fleetGPUs(fleet, func(int, *fleetNode) bool { return true })
	bad := fleetGPUs(fleet, func(_ int, n *fleetNode) bool { return n.labels[fleetcollect.DriverVersionLabel] == badDriver })
	rest := fleetGPUs(fleet, func(_ int, n *fleetNode) bool { return n.labels[fleetcollect.DriverVersionLabel] != badDriver })
	waveBad, waveRest := len(bad)/10, len(rest)/200
	falseFindings, tested, found := 0, 0, 0
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		rng := rand.New(rand.NewPCG(seed, 47))
		wave := append(pick(rng, bad, waveBad), pick(rng, rest, waveRest)...)
		j, faults := judgeScenario(t, rep, policy, fleet, rng, wave)
		t.Logf("seed %d, driver wave: %d faulty GPUs (%d of %s's %d, %d of the other %d), %d faults; %s",
			seed, len(wave), waveBad, badDriver, len(bad), waveRest, len(rest), faults, figures(j))
		got := findings(j.res)
		if len(got) != 1 || got[0] != fleetcollect.AttributeDriver+"="+badDriver {
			t.Errorf("seed %d, driver wave: findings %v, want exactly %s=%s", seed, got, fleetcollect.AttributeDriver, badDriver)
		} else if f := j.res.SharedCauses[0]; f.FaultyGPUs != waveBad || f.GPUs != len(bad) || f.Nodes != len(bad)/gpusPerNode {
			t.Errorf("seed %d, driver wave: %s; want %d faulty of %d GPUs on %d nodes", seed, describe(f), waveBad, len(bad), len(bad)/gpusPerNode)
		} else {
			found++
		}
		if j.res.FaultyGPUs != len(wave) {
			t.Errorf("seed %d, driver wave: the judge counted %d faulty GPUs, want %d", seed, j.res.FaultyGPUs, len(wave))
		}

		uniform := pick(rng, all, len(wave))
		j, faults = judgeScenario(t, rep, policy, fleet, rng, uniform)
		t.Logf("seed %d, uniform: %d faulty GPUs, %d faults; %s; the strongest group: %s", seed, len(uniform), faults, figures(j), strongest(t, j))
		tested += j.res.GroupsTested
		for _, f := range j.res.SharedCauses {
			falseFindings++
			t.Errorf("seed %d, uniform faults: false finding %s", seed, describe(f))
		}
		if j.res.FaultyGPUs != len(uniform) {
			t.Errorf("seed %d, uniform: the judge counted %d faulty GPUs, want %d", seed, j.res.FaultyGPUs, len(uniform))
		}
	}
	t.Logf("%d false findings in %d seeds of uniform faults (%d groups tested); %d of %d driver waves found alone",
		falseFindings, seeds, tested, found, seeds)
}

// judgeScenario writes the reports of a fleet whose faulty GPUs are faulty (faultSignals each,
// now), every other GPU healthy, and judges the cluster; it returns the judgement and how many
// faults the agents recorded.
func judgeScenario(t *testing.T, rep *reporter, policy *health.Policy, fleet []*fleetNode, rng *rand.Rand, faulty []gpuRef) (judgement, int) {
	t.Helper()
	ctx := t.Context()
	now := time.Now()
	signals := map[*fleetNode][]health.Signal{}
	faults := 0
	for _, g := range faulty {
		s := faultSignals(rng, g.uuid(), now)
		faults += (len(s) + 1) / 2 // a fault, or a fault, a reset and a fault
		signals[g.node] = append(signals[g.node], s...)
	}
	r, err := reports(policy, fleet, signals)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	patched, err := rep.write(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes' reports patched in %.2fs", patched, time.Since(start).Seconds())
	j, err := judgeCluster(ctx, rep.admin, time.Now(), true)
	if err != nil {
		t.Fatal(err)
	}
	if j.res.Faults != faults {
		t.Errorf("the judge counted %d faults, want the %d the agents recorded", j.res.Faults, faults)
	}
	return j, faults
}

// figures is what a judgement logs: its fleet, what it tested, how long it took, its findings.
func figures(j judgement) string {
	s := j.res
	out := fmt.Sprintf("judged %d GPUs of %d nodes (%d faulty, %.2f%%) and %d running pods, %d groups tested, threshold p < %.3g; listed in %v, collected and judged in %v",
		s.GPUs, j.nodes, s.FaultyGPUs, 100*s.FleetRate, j.pods, s.GroupsTested, s.Threshold, j.list.Round(time.Millisecond), j.judge.Round(time.Microsecond))
	if len(s.SharedCauses) == 0 {
		return out + "; no finding"
	}
	for _, f := range s.SharedCauses {
		out += "; finding " + describe(f)
	}
	return out
}

// strongest is the judgement's fleet judged again with every rule but the test's let go (any
// count, any ratio, alpha 0.999): its strongest group, how near a false finding came.
func strongest(t *testing.T, j judgement) string {
	t.Helper()
	loose := sharedcause.Options{MinFaultyGPUs: 1, MinFaultyNodes: 1, MinRatio: 1, Alpha: 0.999}
	res, err := sharedcause.Judge(j.res.Now, j.collected.Fleet, loose)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.SharedCauses) == 0 {
		return fmt.Sprintf("none below p %.3g", res.Threshold)
	}
	return describe(res.SharedCauses[0])
}
