package sharedcause

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The job of the signature tests holds GPUs 0 and 1 of nodes 0, 21, 42, 60, 81, 102, 120 and
// 141 of testFleet: 16 GPUs in racks 0 to 7, all on driver 570.172.08.
const job = "ml/Job/train-llm"

var jobNodes = []int{0, 21, 42, 60, 81, 102, 120, 141}

func jobGPUs() []string {
	var uuids []string
	for _, n := range jobNodes {
		uuids = append(uuids, testUUID(n, 0), testUUID(n, 1))
	}
	return uuids
}

func jobWorkloads() map[string][]string { return map[string][]string{job: jobGPUs()} }

// jobBurst gives each of the job's GPUs one fault, the k-th spacing after the first (five
// minutes ago plus start), with reasons[k % len] (XID45 when reasons is nil).
func jobBurst(start, spacing time.Duration, reasons []string) []Fault {
	if reasons == nil {
		reasons = []string{"XID45"}
	}
	var faults []Fault
	for k, u := range jobGPUs() {
		at := now.Add(-5*time.Minute + start + time.Duration(k)*spacing)
		faults = append(faults, Fault{GPU: u, Time: at, Reason: reasons[k%len(reasons)]})
	}
	return faults
}

// background is three faults elsewhere, one on each driver.
func background() []Fault {
	return []Fault{
		{GPU: testUUID(300, 0), Time: now.Add(-20 * time.Minute), Reason: "XID79"},
		{GPU: testUUID(301, 3), Time: now.Add(-30 * time.Minute), Reason: "XID79"},
		{GPU: testUUID(302, 5), Time: now.Add(-10 * time.Minute), Reason: "XID48"},
	}
}

func reasonsN(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("XID%d", 40+i)
	}
	return out
}

func TestWorkloadSignature(t *testing.T) {
	burst := jobBurst(0, 300*time.Millisecond, nil) // 16 GPUs within 4.5 s
	withGPUs := func(n int) map[string][]string {   // the job, holding n GPUs: its 16, then idle ones
		held := jobGPUs()
		for i := 0; len(held) < n; i++ {
			held = append(held, testUUID(400+i/8, i%8))
		}
		return map[string][]string{job: held}
	}
	tests := []struct {
		name       string
		faults     []Fault
		workloads  map[string][]string
		signatures int
		findings   bool // whether shared causes are expected (the job's driver, when its faults count)
	}{
		{"a burst on the job's 16 GPUs is its signature", burst, jobWorkloads(), 1, false},
		{"the same burst, no workloads known: the driver looks bad", burst, nil, 0, true},
		{"16 reasons", jobBurst(0, 300*time.Millisecond, reasonsN(16)), jobWorkloads(), 0, true},
		{"4 reasons of 4 GPUs each, a quarter of the job", jobBurst(0, 300*time.Millisecond, reasonsN(4)), jobWorkloads(), 0, true},
		{"spread over 10 minutes", jobBurst(-5*time.Minute, 40*time.Second, nil), jobWorkloads(), 0, true},
		{"half of a job of 32 GPUs", burst, withGPUs(32), 1, false},
		{"less than half of a job of 33 GPUs", burst, withGPUs(33), 0, true},
		{"the workload lists unknown GPUs and one twice", burst,
			map[string][]string{job: append(jobGPUs(), "GPU-unknown", jobGPUs()[0])}, 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Judge(now, Fleet{GPUs: testFleet(), Faults: append(tc.faults, background()...), Workloads: tc.workloads}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Signatures) != tc.signatures {
				t.Fatalf("%d signatures, want %d: %+v", len(res.Signatures), tc.signatures, res.Signatures)
			}
			if got := len(res.SharedCauses) > 0; got != tc.findings {
				t.Errorf("findings %v, want some: %v", names(res.SharedCauses), tc.findings)
			}
			for _, u := range jobGPUs() {
				if res.Explained(u) != (tc.signatures == 1) {
					t.Errorf("Explained(%s) = %v", u, res.Explained(u))
				}
			}
			if tc.signatures == 0 {
				return
			}
			sig, uuids := res.Signatures[0], slices.Sorted(slices.Values(jobGPUs()))
			if sig.Workload != job || sig.Reason != "XID45" || !slices.Equal(sig.GPUs, uuids) || sig.Faults != 16 ||
				!sig.First.Equal(burst[0].Time) || !sig.Last.Equal(burst[15].Time) {
				t.Errorf("signature %+v", sig)
			}
			if res.FaultyGPUs != 3 || res.Faults != 3 {
				t.Errorf("%d faults on %d GPUs counted, want the background's 3 on 3", res.Faults, res.FaultyGPUs)
			}
		})
	}
}

// TestSignatureStorm: a burst whose GPUs go on logging the same XID every 20 s for five more
// minutes is one signature that explains the whole storm; a GPU of it that also fell off the bus
// is not Explained, though its XID45s are.
func TestSignatureStorm(t *testing.T) {
	faults := jobBurst(0, 300*time.Millisecond, nil)
	for step := range 15 {
		faults = append(faults, jobBurst(5*time.Second+time.Duration(step)*20*time.Second, 0, nil)...)
	}
	lost := Fault{GPU: jobGPUs()[3], Time: now.Add(-time.Minute), Reason: "XID79"}
	faults = append(faults, lost)
	res, err := Judge(now, Fleet{GPUs: testFleet(), Faults: faults, Workloads: jobWorkloads()}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Signatures) != 1 || res.Signatures[0].Faults != 16*16 {
		t.Fatalf("signatures %+v, want one of 256 faults", res.Signatures)
	}
	if res.FaultyGPUs != 1 || res.Faults != 1 {
		t.Errorf("%d faults on %d GPUs counted, want the lost GPU's 1 on 1", res.Faults, res.FaultyGPUs)
	}
	if res.Explained(lost.GPU) || res.ExplainedFault(lost) {
		t.Errorf("the GPU that fell off the bus is explained")
	}
	if !res.ExplainedFault(faults[3]) || !res.Explained(jobGPUs()[4]) || res.ExplainedFault(Fault{GPU: lost.GPU, Time: faults[3].Time}) {
		t.Errorf("ExplainedFault of the lost GPU's XID45 %v, Explained of another %v", res.ExplainedFault(faults[3]), res.Explained(jobGPUs()[4]))
	}
}

// TestSignatureStormIsPerGPU: after the job's burst, GPU 0 alone goes on logging XID45 every 20 s
// for four minutes; GPU 1 logs one more XID45 three minutes after the burst. GPU 0's storm is the
// signature's; GPU 1's late fault follows no fault of its own within the window, so it is a
// fault of GPU 1, however close it is to GPU 0's.
func TestSignatureStormIsPerGPU(t *testing.T) {
	gpus := jobGPUs()
	faults := jobBurst(0, 200*time.Millisecond, nil)
	for step := range 12 {
		faults = append(faults, Fault{GPU: gpus[0], Time: now.Add(-5*time.Minute + time.Duration(step+1)*20*time.Second), Reason: "XID45"})
	}
	late := Fault{GPU: gpus[1], Time: now.Add(-2*time.Minute + time.Second), Reason: "XID45"}
	faults = append(faults, late)
	res, err := Judge(now, Fleet{GPUs: testFleet(), Faults: faults, Workloads: jobWorkloads()}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Signatures) != 1 || res.Signatures[0].Faults != 16+12 {
		t.Fatalf("signatures %+v, want one of 28 faults", res.Signatures)
	}
	if res.ExplainedFault(late) || res.Explained(gpus[1]) || res.FaultyGPUs != 1 {
		t.Errorf("GPU 1's late XID45: explained %v, GPU explained %v, faulty GPUs %d; want a fault of its own", res.ExplainedFault(late), res.Explained(gpus[1]), res.FaultyGPUs)
	}
	if !res.Explained(gpus[0]) {
		t.Errorf("GPU 0's storm is not explained")
	}
}
