package sharedcause

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// maxReasons bounds a finding's Reasons.
const maxReasons = 5

// groupKey names a group: the GPUs whose Attributes[attr] is value.
type groupKey struct{ attr, value string }

// group is one group's counts; the maps and since are filled for candidates only.
type group struct {
	gpus, faulty, faults int
	logP, ratio          float64
	// nodeRuns counts the runs of one node among the group's GPUs in the fleet's order, and
	// lastNode is the current run's node: the group's nodes when nodes are contiguous.
	nodeRuns int
	lastNode string

	nodes, faultyNodes map[string]struct{}
	since              time.Time
	reasons            map[string]int
}

// findSharedCauses counts every group's GPUs and faulty GPUs, tests each against the rest of the
// fleet, and turns those that pass every rule into findings, strongest first.
func (j *judgement) findSharedCauses() {
	groups := j.countGroups()
	candidates := j.testGroups(groups)
	if len(candidates) == 0 {
		return
	}
	j.describe(candidates)
	for k, g := range candidates {
		if len(g.faultyNodes) < j.opts.MinFaultyNodes {
			continue
		}
		j.res.SharedCauses = append(j.res.SharedCauses, j.finding(k, g))
	}
	slices.SortFunc(j.res.SharedCauses, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.LogPValue, b.LogPValue), cmp.Compare(b.Ratio, a.Ratio),
			cmp.Compare(a.Attribute, b.Attribute), cmp.Compare(a.Value, b.Value))
	})
}

// countGroups counts each group's GPUs (every GPU) and faulty GPUs and faults (the faulty GPUs
// only). This is the judge's one pass over GPUs × attributes, so it spares hashing where it
// can: GPUs come node by node and rack by rack, and a GPU's value is usually the one before's.
func (j *judgement) countGroups() map[groupKey]*group {
	byAttr := make(map[string]*attribute)
	for i := range j.gpus {
		n, node := j.unexplained[i], j.gpus[i].Node
		for a, v := range j.gpus[i].Attributes {
			if v == "" {
				continue
			}
			at := byAttr[a]
			if at == nil {
				at = &attribute{values: make(map[string]*group)}
				byAttr[a] = at
			}
			g := at.group(v)
			g.gpus++
			if node != "" && node != g.lastNode {
				g.nodeRuns++
				g.lastNode = node
			}
			if n > 0 {
				g.faulty++
				g.faults += int(n)
			}
		}
	}
	groups := make(map[groupKey]*group)
	for a, at := range byAttr {
		for v, g := range at.values {
			groups[groupKey{a, v}] = g
		}
	}
	return groups
}

// attribute is one attribute's groups by value, and the last one looked up.
type attribute struct {
	values    map[string]*group
	lastValue string
	last      *group
}

func (at *attribute) group(v string) *group {
	if at.last != nil && v == at.lastValue {
		return at.last
	}
	g := at.values[v]
	if g == nil {
		g = &group{}
		at.values[v] = g
	}
	at.lastValue, at.last = v, g
	return g
}

// testGroups sets the Bonferroni threshold and returns the groups that pass the count, ratio
// and Fisher rules. A group is tested when it could ever be a finding: it has at least
// MinFaultyGPUs GPUs and is not the whole fleet. Which groups those are depends on the fleet
// alone, not on its faults, so the threshold stays a true Bonferroni bound.
func (j *judgement) testGroups(groups map[groupKey]*group) map[groupKey]*group {
	total, faulty := j.res.GPUs, j.res.FaultyGPUs
	tested := func(g *group) bool { return g.gpus >= j.opts.MinFaultyGPUs && g.gpus < total }
	for _, g := range groups {
		if tested(g) {
			j.res.GroupsTested++
		}
	}
	if j.res.GroupsTested == 0 {
		return nil
	}
	j.res.Threshold = j.opts.Alpha / float64(j.res.GroupsTested)
	logThreshold := math.Log(j.opts.Alpha) - math.Log(float64(j.res.GroupsTested))
	candidates := make(map[groupKey]*group)
	for k, g := range groups {
		if !tested(g) || g.faulty < j.opts.MinFaultyGPUs {
			continue
		}
		rest := correctedRate(faulty-g.faulty, total-g.gpus)
		g.ratio = float64(g.faulty) / float64(g.gpus) / rest
		if g.ratio < j.opts.MinRatio {
			continue
		}
		g.logP = logHypergeomTail(g.faulty, total, faulty, g.gpus)
		if g.logP < logThreshold {
			candidates[k] = g
		}
	}
	return candidates
}

// correctedRate is the rate of k faulty GPUs in n with a continuity correction of one half:
// (k+0.5)/(n+1), above 0 when k is 0 and below 1 when k is n.
func correctedRate(k, n int) float64 {
	return (float64(k) + 0.5) / (float64(n) + 1)
}

// describe fills the candidates' nodes, faulty nodes, first fault and reasons. It passes over
// every GPU once more, but looks up only the attributes the candidates name.
func (j *judgement) describe(candidates map[groupKey]*group) {
	var attrs []string
	for k, g := range candidates {
		if !slices.Contains(attrs, k.attr) {
			attrs = append(attrs, k.attr)
		}
		g.nodes, g.faultyNodes = make(map[string]struct{}), make(map[string]struct{})
		g.reasons = make(map[string]int)
	}
	for _, gpu := range j.gpus {
		if j.nodesContiguous {
			break // countGroups counted them
		}
		for _, a := range attrs {
			if g := candidates[groupKey{a, gpu.Attributes[a]}]; g != nil && gpu.Node != "" {
				g.nodes[gpu.Node] = struct{}{}
			}
		}
	}
	for _, f := range j.faults {
		if f.explained {
			continue
		}
		gpu := &j.gpus[f.gpu]
		for _, a := range attrs {
			g := candidates[groupKey{a, gpu.Attributes[a]}]
			if g == nil {
				continue
			}
			if gpu.Node != "" {
				g.faultyNodes[gpu.Node] = struct{}{}
			}
			if g.since.IsZero() || f.time.Before(g.since) {
				g.since = f.time
			}
			g.reasons[f.reason]++
		}
	}
}

// nodes returns how many nodes the group's GPUs are in.
func (j *judgement) nodes(g *group) int {
	if !j.nodesContiguous {
		return len(g.nodes)
	}
	return g.nodeRuns
}

// finding turns a described candidate into a Finding.
func (j *judgement) finding(k groupKey, g *group) Finding {
	restGPUs := j.res.GPUs - g.gpus
	f := Finding{
		Attribute:   k.attr,
		Value:       k.value,
		Faults:      g.faults,
		FaultyGPUs:  g.faulty,
		GPUs:        g.gpus,
		Nodes:       j.nodes(g),
		FaultyNodes: len(g.faultyNodes),
		Rate:        float64(g.faulty) / float64(g.gpus),
		RestRate:    float64(j.res.FaultyGPUs-g.faulty) / float64(restGPUs),
		Ratio:       g.ratio,
		PValue:      math.Exp(g.logP),
		LogPValue:   g.logP,
		Since:       g.since,
	}
	for r, n := range g.reasons {
		f.Reasons = append(f.Reasons, ReasonCount{Reason: r, Faults: n})
	}
	slices.SortFunc(f.Reasons, func(a, b ReasonCount) int {
		return cmp.Or(cmp.Compare(b.Faults, a.Faults), cmp.Compare(a.Reason, b.Reason))
	})
	if len(f.Reasons) > maxReasons {
		f.Reasons = f.Reasons[:maxReasons]
	}
	return f
}
