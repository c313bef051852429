package annotation

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// errBadState says VolcanoStateKey holds something that is not gpuhealth's JSON.
var errBadState = errors.New(VolcanoStateKey + " is not valid JSON: every entry of " + UnhealthyIDsKey + " is kept as another writer's")

// VolcanoStateKey records gpuhealth's share of volcano.sh/gpu-unhealthy-ids, because that key has
// other writers: Volcano's own device plugin (which deletes the key when it starts and writes its
// own list of indexes when it sees XIDs, never removing one) and operators. The value is JSON:
//
//	{"written":"3,5","others":"5"}
//
// written is the value gpuhealth last wrote; others is the part of it that belonged to other
// writers. The rules (docs/compatibility.md):
//   - gpuhealth never drops an entry another writer put there: the key's value is always the
//     other writers' entries plus the indexes gpuhealth finds Unhealthy, ascending, and entries that
//     are not indexes kept verbatim at the end (Volcano's scheduler skips those);
//   - gpuhealth removes only indexes it added: when one of its GPUs recovers, the index goes unless
//     another writer has it too;
//   - when another writer changes the key (a new list, a deletion), its new value is taken as that
//     writer's whole intent: every entry in it counts as the other writer's until the other writer
//     removes it. This errs towards keeping a GPU out of scheduling, never towards putting a sick
//     one back;
//   - each change by another writer costs at most one write by gpuhealth, and gpuhealth's own write
//     causes none: no write fight.
//
// Without a state (first start of this version), entries of the current value that gpuhealth's
// previous health annotation marked Unhealthy count as gpuhealth's own.
const VolcanoStateKey = "gpuhealth.dev/volcano-unhealthy-ids-state"

type volcanoState struct {
	Written string `json:"written"`
	Others  string `json:"others"`
}

// idList is a parsed volcano.sh/gpu-unhealthy-ids value: GPU indexes, plus entries that are not
// indexes (kept verbatim, in order, so nothing another writer wrote is lost).
type idList struct {
	indexes []int
	garbage []string
}

func parseIDList(v string) idList {
	var l idList
	for entry := range strings.SplitSeq(v, ",") {
		s := strings.TrimSpace(entry)
		if s == "" {
			continue
		}
		if i, err := strconv.Atoi(s); err == nil && i >= 0 {
			l.indexes = append(l.indexes, i)
		} else if !slices.Contains(l.garbage, s) {
			l.garbage = append(l.garbage, s)
		}
	}
	slices.Sort(l.indexes)
	l.indexes = slices.Compact(l.indexes)
	return l
}

// String formats the list as Volcano's device plugin does: ascending, comma-separated, no spaces.
func (l idList) String() string {
	parts := make([]string, 0, len(l.indexes)+len(l.garbage))
	for _, i := range l.indexes {
		parts = append(parts, strconv.Itoa(i))
	}
	return strings.Join(append(parts, l.garbage...), ",")
}

func (l idList) without(drop []int) idList {
	return idList{
		indexes: slices.DeleteFunc(slices.Clone(l.indexes), func(i int) bool { return slices.Contains(drop, i) }),
		garbage: l.garbage,
	}
}

func (l idList) with(add []int) idList {
	out := idList{indexes: slices.Concat(l.indexes, add), garbage: l.garbage}
	slices.Sort(out.indexes)
	out.indexes = slices.Compact(out.indexes)
	return out
}

// volcanoMerge is the outcome of merging gpuhealth's indexes into the key's current value.
type volcanoMerge struct {
	// value is the key's new value; "" means the key must be absent.
	value string
	// state is VolcanoStateKey's new value; "" means absent (nothing to protect).
	state string
	// garbage lists entries of the current value that are not GPU indexes (for a log line).
	garbage []string
	// stateErr is set when the recorded state could not be read.
	stateErr error
}

// mergeVolcanoIDs applies the rules of VolcanoStateKey. current is the key's value ("" when
// absent), stateRaw VolcanoStateKey's, previousHealth gpuhealth's previous HealthKey value, ours the
// indexes gpuhealth finds Unhealthy now.
func mergeVolcanoIDs(current, stateRaw, previousHealth string, ours []int) volcanoMerge {
	var m volcanoMerge
	observed := parseIDList(current)
	m.garbage = observed.garbage
	var others idList
	var state volcanoState
	switch {
	case stateRaw != "" && json.Unmarshal([]byte(stateRaw), &state) != nil:
		m.stateErr = errBadState
		others = observed
	case stateRaw != "" && state.Written == current:
		// Unchanged since gpuhealth wrote it: the other writers' share is what it was then.
		others = parseIDList(state.Others)
	case stateRaw != "":
		// Someone else changed it since: their value is their intent.
		others = observed
	default:
		others = observed.without(previouslyUnhealthy(previousHealth))
	}
	value := others.with(ours)
	m.value = value.String()
	if m.value != "" {
		b, _ := json.Marshal(volcanoState{Written: m.value, Others: others.String()}) // cannot fail
		m.state = string(b)
	}
	return m
}

// previouslyUnhealthy returns the indexes of physical GPUs that a HealthKey value marks Unhealthy.
// A missing or unreadable value yields none: then every entry counts as another writer's.
func previouslyUnhealthy(healthJSON string) []int {
	if healthJSON == "" {
		return nil
	}
	var summary map[string]report.GPUSummary
	if json.Unmarshal([]byte(healthJSON), &summary) != nil {
		return nil
	}
	var out []int
	for _, s := range summary {
		if s.ParentUUID == "" && s.Health == health.Unhealthy.String() {
			out = append(out, s.Index)
		}
	}
	return out
}
