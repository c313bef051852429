package gpurecord

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// RepeatOffenderRule says which past makes a GPU a repeat offender wherever it appears: Faults
// faults within Within of now, or (ReplaceGPU) an escalation to ReplaceGPU. Events before the
// record's newest EventCleared (an administrator inspected the card) do not count. A zero Faults
// counts no faults.
type RepeatOffenderRule struct {
	Faults     int
	Within     time.Duration
	ReplaceGPU bool
}

// Enabled reports whether the rule can find anything.
func (rule RepeatOffenderRule) Enabled() bool { return rule.Faults > 0 || rule.ReplaceGPU }

// Verdict is what a rule says of a record.
type Verdict struct {
	// Offender is set when the record meets the rule.
	Offender bool
	// Message names the past that met it.
	Message string
	// Newest is the time of the newest event the verdict counted: an agent raises a verdict once
	// per Newest, so that an administrator's clear sticks until the card fails again.
	Newest time.Time
}

// maxNamedEvents bounds the events a verdict's message names.
const maxNamedEvents = 3

// Judge applies the rule to r at now.
func (rule RepeatOffenderRule) Judge(r *GPURecord, now time.Time) Verdict {
	var since time.Time
	for _, e := range r.Events {
		if e.Kind == EventCleared && e.Time.After(since) {
			since = e.Time.Time
		}
	}
	var counted []Event
	var why []string
	if rule.Faults > 0 {
		from := now.Add(-rule.Within)
		if from.Before(since) {
			from = since
		}
		if faults := r.FaultsSince(from); len(faults) >= rule.Faults {
			counted = append(counted, faults...)
			why = append(why, fmt.Sprintf("%s within %v on %s", plural(len(faults), "fault"), rule.Within, nodesOf(faults)))
		}
	}
	if rule.ReplaceGPU {
		var replaced []Event
		for _, e := range r.Events {
			if e.Kind == EventReplaceGPU && !e.Time.Time.Before(since) {
				replaced = append(replaced, e)
			}
		}
		if len(replaced) > 0 {
			counted = append(counted, replaced...)
			why = append(why, "escalated to ReplaceGPU on "+nodesOf(replaced))
		}
	}
	if len(counted) == 0 {
		return Verdict{}
	}
	slices.SortFunc(counted, func(a, b Event) int { return a.Time.Compare(b.Time.Time) })
	return Verdict{
		Offender: true,
		Newest:   counted[len(counted)-1].Time.Time,
		Message:  fmt.Sprintf("board serial %s: %s; newest: %s", r.Serial, strings.Join(why, "; "), describe(counted)),
	}
}

// nodesOf names the nodes of events, in order of first appearance.
func nodesOf(events []Event) string {
	var nodes []string
	for _, e := range events {
		if !slices.Contains(nodes, e.Node) {
			nodes = append(nodes, e.Node)
		}
	}
	if len(nodes) == 1 {
		return "node " + nodes[0]
	}
	return "nodes " + strings.Join(nodes, ", ")
}

// describe names the newest maxNamedEvents events, newest first.
func describe(events []Event) string {
	var parts []string
	for i := len(events) - 1; i >= 0 && len(parts) < maxNamedEvents; i-- {
		e := events[i]
		what := string(e.Kind)
		if e.Reason != "" {
			what = e.Reason
		}
		parts = append(parts, fmt.Sprintf("%s on %s GPU %d at %s", what, e.Node, e.Index, e.Time.UTC().Format(time.RFC3339)))
	}
	return strings.Join(parts, ", ")
}

// plural is "1 fault", "3 faults".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
