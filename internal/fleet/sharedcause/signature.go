package sharedcause

import (
	"cmp"
	"slices"
	"time"
)

// findSignatures finds every workload's signatures and marks the faults they explain. Workloads
// go in name order, so that a fault on a GPU two workloads share is explained by the first,
// whatever the map's order.
func (j *judgement) findSignatures(workloads map[string][]string) {
	names := make([]string, 0, len(workloads))
	for name := range workloads {
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) == 0 || len(j.faults) == 0 {
		return
	}
	stamp := make([]int32, len(j.gpus)) // which workload (its place in names, from 1) last held the GPU
	var held []int32
	for w, name := range names {
		if len(workloads[name]) < j.opts.MinSignatureGPUs {
			continue
		}
		held = j.held(workloads[name], stamp, int32(w+1), held[:0])
		if len(held) < j.opts.MinSignatureGPUs {
			continue
		}
		byReason := make(map[string][]int32)
		for _, g := range held {
			for _, fi := range j.byGPU[g] {
				if f := &j.faults[fi]; !f.explained {
					byReason[f.reason] = append(byReason[f.reason], fi)
				}
			}
		}
		reasons := make([]string, 0, len(byReason))
		for r := range byReason {
			reasons = append(reasons, r)
		}
		slices.Sort(reasons)
		for _, r := range reasons {
			list := byReason[r]
			slices.SortFunc(list, func(a, b int32) int {
				return cmp.Or(j.faults[a].time.Compare(j.faults[b].time), cmp.Compare(a, b))
			})
			j.signaturesOf(name, len(held), list)
		}
	}
	slices.SortStableFunc(j.res.Signatures, func(a, b Signature) int {
		return cmp.Or(cmp.Compare(a.Workload, b.Workload), a.First.Compare(b.First), cmp.Compare(a.Reason, b.Reason))
	})
}

// held appends to held the places of the workload's known GPUs, each once: stamp[g] is mark
// once g is in.
func (j *judgement) held(uuids []string, stamp []int32, mark int32, held []int32) []int32 {
	for _, u := range uuids {
		g, ok := j.index[u]
		if !ok || stamp[g] == mark {
			continue
		}
		stamp[g] = mark
		held = append(held, g)
	}
	return held
}

// signaturesOf finds the signatures among one workload's faults of one reason, sorted by time:
// the burst (faults within SignatureWindow of each other) on the most GPUs, if it spans enough
// of them; then the next among the faults left, until none does.
func (j *judgement) signaturesOf(workload string, heldGPUs int, list []int32) {
	for len(list) >= j.opts.MinSignatureGPUs {
		lo, hi, distinct := j.widestBurst(list)
		if distinct < j.opts.MinSignatureGPUs ||
			float64(distinct) < j.opts.SignatureFraction*float64(heldGPUs) {
			return
		}
		in := j.extendBurst(list, lo, hi)
		sig := Signature{Workload: workload, Reason: j.faults[list[lo]].reason, WorkloadGPUs: heldGPUs}
		gpus := make(map[int32]struct{}, distinct)
		left := list[:0:0]
		for i, fi := range list {
			if !in[i] {
				left = append(left, fi)
				continue
			}
			f := &j.faults[fi]
			f.explained = true
			gpus[f.gpu] = struct{}{}
			sig.Faults++
			if sig.First.IsZero() || f.time.Before(sig.First) {
				sig.First = f.time
			}
			if f.time.After(sig.Last) {
				sig.Last = f.time
			}
		}
		for g := range gpus {
			sig.GPUs = append(sig.GPUs, j.gpus[g].UUID)
		}
		slices.Sort(sig.GPUs)
		j.res.Signatures = append(j.res.Signatures, sig)
		list = left
	}
}

// widestBurst returns the earliest run list[lo..hi] no longer than SignatureWindow that spans the
// most GPUs, and how many it spans.
func (j *judgement) widestBurst(list []int32) (lo, hi, distinct int) {
	count := make(map[int32]int)
	start, spans := 0, 0
	for end, fi := range list {
		f := &j.faults[fi]
		if count[f.gpu] == 0 {
			spans++
		}
		count[f.gpu]++
		for f.time.Sub(j.faults[list[start]].time) > j.opts.SignatureWindow {
			g := j.faults[list[start]].gpu
			if count[g]--; count[g] == 0 {
				spans--
			}
			start++
		}
		if spans > distinct {
			lo, hi, distinct = start, end, spans
		}
	}
	return lo, hi, distinct
}

// extendBurst marks list[lo..hi] and, on either side, each of the burst's GPUs' own faults
// that follow that GPU's previous (or next) marked fault within SignatureWindow: a storm of one
// XID that goes on, GPU by GPU, after the workload's burst is the same signature, not a GPU
// fault. Every GPU has its own edge, so one GPU's storm explains no other GPU's later faults.
func (j *judgement) extendBurst(list []int32, lo, hi int) []bool {
	in := make([]bool, len(list))
	last := make(map[int32]time.Time)  // GPU → its latest marked fault
	first := make(map[int32]time.Time) // GPU → its earliest marked fault
	for i := lo; i <= hi; i++ {
		in[i] = true
		f := j.faults[list[i]]
		if t, ok := last[f.gpu]; !ok || f.time.After(t) {
			last[f.gpu] = f.time
		}
		if t, ok := first[f.gpu]; !ok || f.time.Before(t) {
			first[f.gpu] = f.time
		}
	}
	within := func(a, b time.Time) bool { return b.Sub(a) <= j.opts.SignatureWindow }
	for i := hi + 1; i < len(list); i++ {
		f := j.faults[list[i]]
		if edge, ok := last[f.gpu]; ok && within(edge, f.time) {
			in[i], last[f.gpu] = true, f.time
		}
	}
	for i := lo - 1; i >= 0; i-- {
		f := j.faults[list[i]]
		if edge, ok := first[f.gpu]; ok && within(f.time, edge) {
			in[i], first[f.gpu] = true, f.time
		}
	}
	return in
}
