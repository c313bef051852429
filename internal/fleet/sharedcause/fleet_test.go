package sharedcause

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// now is the judgements' clock in every test.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testFleet is a fleet of 600 nodes of 8 GPUs, 20 nodes a rack, whose attributes cut across one
// another: node i has driver i%3, VBIOS (i/3)%4, zone (i/12)%3, a 4-node NVLink domain and the
// model H200 where i%10 is 9 (H100 elsewhere). No group of one attribute is a group of another.
const (
	testNodes       = 600
	testGPUsPerNode = 8
	testGPUs        = testNodes * testGPUsPerNode
)

var testDrivers = []string{"570.172.08", "575.64.05", "580.95.05"}

func testFleet() []GPU {
	gpus := make([]GPU, 0, testGPUs)
	for i := range testNodes {
		model := "H100"
		if i%10 == 9 {
			model = "H200"
		}
		for g := range testGPUsPerNode {
			gpus = append(gpus, GPU{
				UUID: testUUID(i, g),
				Node: testNode(i),
				Attributes: map[string]string{
					"driver":       testDrivers[i%3],
					"vbios":        fmt.Sprintf("96.00.%02X.00.01", (i/3)%4),
					"zone":         fmt.Sprintf("zone-%c", 'a'+(i/12)%3),
					"rack":         fmt.Sprintf("rack-%02d", i/20),
					"nvlinkDomain": fmt.Sprintf("clique-%03d", i/4),
					"model":        model,
				},
			})
		}
	}
	return gpus
}

func testNode(i int) string    { return fmt.Sprintf("node-%03d", i) }
func testUUID(i, g int) string { return fmt.Sprintf("GPU-%04d-%d", i, g) }

// faultsOn gives each GPU 1 to 3 faults at random times in the last 50 minutes, reason XID79 or
// XID48.
func faultsOn(rng *rand.Rand, uuids []string) []Fault {
	var faults []Fault
	for _, u := range uuids {
		for range 1 + rng.IntN(3) {
			faults = append(faults, Fault{GPU: u, Time: randomTime(rng), Reason: []string{"XID79", "XID48"}[rng.IntN(2)]})
		}
	}
	return faults
}

func randomTime(rng *rand.Rand) time.Time {
	return now.Add(-time.Duration(rng.Int64N(int64(50 * time.Minute))))
}

// pick returns n distinct UUIDs of gpus, at random.
func pick(rng *rand.Rand, gpus []GPU, n int) []string {
	out := make([]string, 0, n)
	for _, i := range rng.Perm(len(gpus))[:n] {
		out = append(out, gpus[i].UUID)
	}
	return out
}

// driverWave is a wave on driver 580.95.05 at 20× the rest's rate: 160 of its 1,600 GPUs faulty
// (10%), 16 of the other 3,200 (0.5%).
func driverWave(rng *rand.Rand, gpus []GPU) []Fault {
	var bad, rest []GPU
	for _, g := range gpus {
		if g.Attributes["driver"] == "580.95.05" {
			bad = append(bad, g)
		} else {
			rest = append(rest, g)
		}
	}
	return append(faultsOn(rng, pick(rng, bad, 160)), faultsOn(rng, pick(rng, rest, 16))...)
}

// uniformFaults spreads n faults over the fleet's GPUs uniformly at random, GPU by GPU.
func uniformFaults(rng *rand.Rand, gpus []GPU, n int) []Fault {
	faults := make([]Fault, n)
	for i := range faults {
		faults[i] = Fault{GPU: gpus[rng.IntN(len(gpus))].UUID, Time: randomTime(rng), Reason: "XID79"}
	}
	return faults
}
