package sharedcause

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchFleet is 50,000 nodes of 8 GPUs with 10 attributes, 50,000 faults (45,000 uniform over the
// fleet, 5,000 on the 320 GPUs of one leaf switch) and 6,250 workloads of 64 GPUs, one of which
// logs a burst.
func benchFleet() Fleet {
	const nodeCount, perNode = 50_000, 8
	rng := rand.New(rand.NewPCG(400, 47))
	gpus := make([]GPU, 0, nodeCount*perNode)
	for n := range nodeCount {
		node := fmt.Sprintf("node-%05d", n)
		attrs := map[string]string{
			"driver":       testDrivers[n%3],
			"vbios":        fmt.Sprintf("96.00.%02X.00.01", (n/3)%8),
			"model":        []string{"H100", "H200", "B200"}[(n/7)%3],
			"zone":         fmt.Sprintf("zone-%d", (n/11)%6),
			"rack":         fmt.Sprintf("rack-%04d", n/20),
			"nvlinkDomain": fmt.Sprintf("clique-%05d", n/18),
			"pool":         fmt.Sprintf("pool-%d", (n/13)%10),
			"switch":       fmt.Sprintf("leaf-%04d", n/40),
			"image":        fmt.Sprintf("ubuntu-24.04-%d", (n/5)%4),
			"cuda":         []string{"12.8", "12.9", "13.0"}[(n/17)%3],
		}
		for g := range perNode {
			gpus = append(gpus, GPU{UUID: fmt.Sprintf("GPU-%05d-%d", n, g), Node: node, Attributes: attrs})
		}
	}
	faults := uniformFaults(rng, gpus, 45_000)
	leaf := gpus[100*40*perNode : 101*40*perNode] // switch leaf-0100: 40 nodes
	for len(faults) < 50_000 {
		faults = append(faults, Fault{GPU: leaf[rng.IntN(len(leaf))].UUID, Time: randomTime(rng), Reason: "XID79"})
	}
	workloads := make(map[string][]string, len(gpus)/64)
	for w := range len(gpus) / 64 {
		for _, g := range gpus[w*64 : (w+1)*64] {
			workloads[fmt.Sprintf("ml/Job/j%04d", w)] = append(workloads[fmt.Sprintf("ml/Job/j%04d", w)], g.UUID)
		}
	}
	for _, u := range workloads["ml/Job/j0042"] {
		faults = append(faults, Fault{GPU: u, Time: now.Add(-time.Minute), Reason: "XID45"})
	}
	return Fleet{GPUs: gpus, Faults: faults, Workloads: workloads}
}

// BenchmarkJudge400kGPUs judges 400,000 GPUs × 10 attributes with 50,000 faults.
func BenchmarkJudge400kGPUs(b *testing.B) {
	fleet := benchFleet()
	res, err := Judge(now, fleet, Options{})
	if err != nil {
		b.Fatal(err)
	}
	if len(res.SharedCauses) == 0 || len(res.Signatures) != 1 {
		b.Fatalf("findings %v, %d signatures: want the wave's and the burst's", names(res.SharedCauses), len(res.Signatures))
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Judge(now, fleet, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
