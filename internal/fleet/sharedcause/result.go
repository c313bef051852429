package sharedcause

import "time"

// GPU is one GPU of the fleet and what it shares with others.
type GPU struct {
	// UUID names the GPU; faults and workloads refer to it.
	UUID string `json:"uuid"`
	// Node is the node the GPU is in; it only counts nodes, it is not grouped by.
	Node string `json:"node"`
	// Attributes are what the GPU may share with others, by name: "driver", "vbios", "model",
	// "nvlinkDomain", "zone", a topology label such as "rack". A name with an empty value is not
	// grouped (the GPU has no value for it).
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Fault is one fault seen on one GPU.
type Fault struct {
	GPU    string    `json:"gpu"`
	Time   time.Time `json:"time"`
	Reason string    `json:"reason"` // "XID79", "DBE", ...
}

// Fleet is what Judge judges.
type Fleet struct {
	// GPUs is every GPU of the fleet, faulty or not: the healthy ones make the rates. The first
	// of two GPUs with one UUID counts; the second is ignored (and counted in Ignored).
	GPUs []GPU
	// Faults are the faults seen; those outside the window, of GPUs not in GPUs, or with no time
	// are ignored (and counted in Ignored).
	Faults []Fault
	// Workloads maps a workload (a Job's or a PodGroup's key, as the caller writes it) to the
	// UUIDs of the GPUs it holds. A GPU may be held by more than one (sharing); UUIDs not in
	// GPUs are ignored.
	Workloads map[string][]string
}

// Result is one judgement of a fleet. Its order is deterministic: the same fleet, in any order,
// gives the same Result. Explained and ExplainedFault answer from the judgement itself: a Result
// read back from JSON keeps its Signatures (and their GPUs), not those answers.
type Result struct {
	// Now and Window say which faults were judged: those in [Now-Window, Now].
	Now    time.Time     `json:"now"`
	Window time.Duration `json:"window"`
	// GPUs is how many GPUs the fleet has; FaultyGPUs how many of them had a fault that no
	// workload signature explains, and Faults how many such faults there were.
	GPUs       int `json:"gpus"`
	FaultyGPUs int `json:"faultyGPUs"`
	Faults     int `json:"faults"`
	// FleetRate is FaultyGPUs / GPUs: the rate a finding is set against when shown.
	FleetRate float64 `json:"fleetRate"`
	// GroupsTested is how many groups were tested; Threshold is the p-value a group had to beat
	// (Alpha / GroupsTested; 0 when none was tested).
	GroupsTested int     `json:"groupsTested"`
	Threshold    float64 `json:"threshold"`
	// SharedCauses are the groups whose fault rate is far above the rest's, strongest first.
	SharedCauses []Finding `json:"sharedCauses"`
	// Signatures are the workloads' signatures, by workload, then time, then reason.
	Signatures []Signature `json:"signatures"`
	// Ignored counts what the judgement left out.
	Ignored Ignored `json:"ignored"`

	explainedGPUs   map[string]bool       // UUID → every fault of the GPU is explained
	explainedFaults map[faultKey]struct{} // faults a signature explains
}

// Finding is one group whose fault rate is far above the rest of the fleet's.
type Finding struct {
	// Attribute and Value name the group: the GPUs whose Attributes[Attribute] is Value.
	Attribute string `json:"attribute"`
	Value     string `json:"value"`
	// Faults is how many faults the group's GPUs had; FaultyGPUs how many of its GPUs had one;
	// GPUs and Nodes how many GPUs and nodes the group has; FaultyNodes how many nodes its faulty
	// GPUs are in.
	Faults      int `json:"faults"`
	FaultyGPUs  int `json:"faultyGPUs"`
	GPUs        int `json:"gpus"`
	Nodes       int `json:"nodes"`
	FaultyNodes int `json:"faultyNodes"`
	// Rate is FaultyGPUs / GPUs; RestRate the same of every other GPU of the fleet, as counted.
	Rate     float64 `json:"rate"`
	RestRate float64 `json:"restRate"`
	// Ratio is Rate over the rest's continuity-corrected rate, so it is finite when the rest had
	// no fault.
	Ratio float64 `json:"ratio"`
	// PValue is the chance of FaultyGPUs or more if the group were like the rest; LogPValue its
	// natural logarithm, exact where PValue underflows to 0.
	PValue    float64 `json:"pValue"`
	LogPValue float64 `json:"logPValue"`
	// Since is the group's earliest fault in the window.
	Since time.Time `json:"since"`
	// Reasons are the group's most frequent reasons, most faults first (at most maxReasons).
	Reasons []ReasonCount `json:"reasons"`
}

// ReasonCount is how many faults had one reason.
type ReasonCount struct {
	Reason string `json:"reason"`
	Faults int    `json:"faults"`
}

// Signature is one workload's faults of one reason on many of its GPUs at once: the workload's
// doing (or its undoing), not as many GPU faults.
type Signature struct {
	Workload string `json:"workload"`
	Reason   string `json:"reason"`
	// GPUs are the UUIDs of the GPUs it spans, sorted; WorkloadGPUs how many GPUs the workload
	// holds.
	GPUs         []string `json:"gpus"`
	WorkloadGPUs int      `json:"workloadGPUs"`
	// Faults is how many faults it explains, First and Last the earliest and latest of them.
	Faults int       `json:"faults"`
	First  time.Time `json:"first"`
	Last   time.Time `json:"last"`
}

// Ignored counts the input a judgement left out, for the caller's log.
type Ignored struct {
	FaultsWithoutTime   int `json:"faultsWithoutTime"`
	FaultsOutsideWindow int `json:"faultsOutsideWindow"`
	FaultsOfUnknownGPUs int `json:"faultsOfUnknownGPUs"`
	GPUsWithoutUUID     int `json:"gpusWithoutUUID"`
	DuplicateGPUs       int `json:"duplicateGPUs"`
}

// Explained reports whether the GPU had faults in the window and a workload signature explains
// every one of them: its verdict is the workload's signature, not a GPU fault. A GPU with one
// explained fault and one other is not explained (ExplainedFault tells them apart).
func (r Result) Explained(uuid string) bool {
	return r.explainedGPUs[uuid]
}

// ExplainedFault reports whether a workload signature explains the fault.
func (r Result) ExplainedFault(f Fault) bool {
	_, ok := r.explainedFaults[keyOf(f)]
	return ok
}

// faultKey identifies a fault: time.Time compares its location and monotonic reading too, so it
// makes no key.
type faultKey struct {
	gpu    string
	nanos  int64
	reason string
}

func keyOf(f Fault) faultKey {
	return faultKey{gpu: f.GPU, nanos: f.Time.UnixNano(), reason: f.Reason}
}
