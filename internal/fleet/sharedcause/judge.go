package sharedcause

import (
	"time"
)

// Judge judges the fleet's faults in [now-opts.Window, now]: first each workload's signatures,
// then, leaving out the faults they explain, the groups of GPUs that share a value and fault far
// more often than the rest (the package comment says how). Zero fields of opts take their
// defaults; the only error is opts' own.
func Judge(now time.Time, fleet Fleet, opts Options) (Result, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return Result{}, err
	}
	j := newJudgement(now, fleet.GPUs, opts)
	j.admitFaults(fleet.Faults)
	j.findSignatures(fleet.Workloads)
	j.tally()
	j.findSharedCauses()
	return j.res, nil
}

// judgement is one Judge call's working state.
type judgement struct {
	opts Options
	// gpus are the fleet's GPUs, one per UUID; index maps a UUID to its place in gpus.
	gpus  []GPU
	index map[string]int32
	// faults are the faults admitted (in the window, of known GPUs); byGPU lists a GPU's.
	faults []fault
	byGPU  map[int32][]int32
	// unexplained counts each GPU's faults that no signature explains, by place in gpus.
	unexplained []int32
	// nodesContiguous says each node's GPUs come one after another in gpus, so that a group's
	// nodes can be counted as runs in the pass that counts its GPUs.
	nodesContiguous bool
	res             Result
}

// fault is an admitted fault.
type fault struct {
	gpu       int32
	time      time.Time
	reason    string
	explained bool
}

func newJudgement(now time.Time, gpus []GPU, opts Options) *judgement {
	j := &judgement{
		opts:  opts,
		gpus:  gpus,
		index: make(map[string]int32, len(gpus)),
		res:   Result{Now: now, Window: opts.Window},
	}
	clean := true
	for i, g := range gpus {
		if _, dup := j.index[g.UUID]; dup || g.UUID == "" {
			clean = false
			continue
		}
		j.index[g.UUID] = int32(i)
	}
	if !clean {
		j.dropBadGPUs()
	}
	j.res.GPUs = len(j.gpus)
	j.nodesContiguous = contiguous(j.gpus)
	return j
}

// contiguous reports whether each node's GPUs come one after another: the usual order, a node
// listing its GPUs.
func contiguous(gpus []GPU) bool {
	seen := make(map[string]struct{})
	prev := ""
	for i := range gpus {
		node := gpus[i].Node
		if i > 0 && node == prev {
			continue
		}
		if _, again := seen[node]; again {
			return false
		}
		seen[node] = struct{}{}
		prev = node
	}
	return true
}

// dropBadGPUs keeps the first GPU of each UUID and drops those without one, counting both; the
// copy is made only when needed, since most fleets are clean.
func (j *judgement) dropBadGPUs() {
	kept := make([]GPU, 0, len(j.index))
	clear(j.index)
	for _, g := range j.gpus {
		if g.UUID == "" {
			j.res.Ignored.GPUsWithoutUUID++
			continue
		}
		if _, dup := j.index[g.UUID]; dup {
			j.res.Ignored.DuplicateGPUs++
			continue
		}
		j.index[g.UUID] = int32(len(kept))
		kept = append(kept, g)
	}
	j.gpus = kept
}

// admitFaults keeps the faults in [now-Window, now] of known GPUs and counts the others.
func (j *judgement) admitFaults(faults []Fault) {
	from := j.res.Now.Add(-j.opts.Window)
	j.byGPU = make(map[int32][]int32)
	for _, f := range faults {
		g, known := j.index[f.GPU]
		switch {
		case f.Time.IsZero():
			j.res.Ignored.FaultsWithoutTime++
		case f.Time.Before(from) || f.Time.After(j.res.Now):
			j.res.Ignored.FaultsOutsideWindow++
		case !known:
			j.res.Ignored.FaultsOfUnknownGPUs++
		default:
			j.byGPU[g] = append(j.byGPU[g], int32(len(j.faults)))
			j.faults = append(j.faults, fault{gpu: g, time: f.Time, reason: f.Reason})
		}
	}
}

// tally counts each GPU's unexplained faults, the fleet's totals, and which GPUs and faults the
// signatures explain.
func (j *judgement) tally() {
	j.unexplained = make([]int32, len(j.gpus))
	for i := range j.faults {
		f := &j.faults[i]
		if f.explained {
			continue
		}
		if j.unexplained[f.gpu] == 0 {
			j.res.FaultyGPUs++
		}
		j.unexplained[f.gpu]++
		j.res.Faults++
	}
	if j.res.GPUs > 0 {
		j.res.FleetRate = float64(j.res.FaultyGPUs) / float64(j.res.GPUs)
	}
	for i := range j.faults {
		f := &j.faults[i]
		if !f.explained {
			continue
		}
		uuid := j.gpus[f.gpu].UUID
		if j.res.explainedFaults == nil {
			j.res.explainedFaults = make(map[faultKey]struct{})
			j.res.explainedGPUs = make(map[string]bool)
		}
		j.res.explainedFaults[faultKey{gpu: uuid, nanos: f.time.UnixNano(), reason: f.reason}] = struct{}{}
		j.res.explainedGPUs[uuid] = j.unexplained[f.gpu] == 0
	}
}
