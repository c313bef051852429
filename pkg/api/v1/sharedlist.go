package v1

// A shared list is a Node annotation that other writers fill too, and ListFormat.Merge merges
// gpuhealth's entries into it: a comma-separated list such as Volcano's
// volcano.sh/gpu-unhealthy-ids (GPU indexes, written also by Volcano's device plugin and by
// operators) or HAMi's hami.io/device-cordon (GPU UUIDs, written by operators). gpuhealth keeps a small state annotation of its own beside each
// list, JSON {"written":"0,2","others":"2"}: the value it last wrote and the other writers' part of
// it. The rules (docs/compatibility.md):
//   - the list is the other writers' entries plus gpuhealth's, in the list's order; entries its
//     readers would not understand are kept verbatim at the end, never repaired;
//   - gpuhealth removes only entries it added;
//   - when the list differs from what gpuhealth last wrote, another writer changed it, and every
//     entry of the new value counts as that writer's until that writer removes it (this errs
//     towards keeping a GPU out, never towards putting a sick one back);
//   - without a state, the caller says whom the current entries belong to: to gpuhealth when an
//     earlier gpuhealth owned the list outright (Volcano's key before this bookkeeping existed),
//     else to other writers;
//   - once written, the state stays, also when the list is empty and absent: its absence means
//     "never managed here".
//
// Merge is pure; the reporters patch the result, so each change by another writer costs at most
// one write and gpuhealth's own write none. VolcanoIDs and HAMiUUIDs are the two lists' formats,
// MergeUnhealthyIDs and MergeCordon the two merges as the reporters do them, and
// ReadUnhealthyIDs and ReadCordon read them back as the schedulers do (read.go).

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
)

// ListFormat describes one shared list.
type ListFormat struct {
	// Valid reports whether an entry is one the list's readers understand.
	Valid func(entry string) bool
	// Compare orders valid entries.
	Compare func(a, b string) int
}

// List is a parsed value: valid entries in order, then the others verbatim.
type List struct {
	valid, other []string
}

// MaxListEntries is more entries than any node has GPUs for; a list longer than that is someone's
// mistake or an attack (MergeResult.Oversized). It is still merged whole, in linear time: the API
// server's 256 KiB limit on a Node's annotations bounds it.
const MaxListEntries = 4096

// Parse splits v on commas, trims each entry, drops empty ones and duplicates. It takes time
// linear in len(v), plus sorting the valid entries.
func (f ListFormat) Parse(v string) List {
	var l List
	seen := map[string]struct{}{}
	for entry := range strings.SplitSeq(v, ",") {
		s := strings.TrimSpace(entry)
		if s == "" {
			continue
		}
		if _, dup := seen[s]; dup {
			continue
		}
		seen[s] = struct{}{}
		if f.Valid(s) {
			l.valid = append(l.valid, s)
		} else {
			l.other = append(l.other, s)
		}
	}
	slices.SortFunc(l.valid, f.Compare)
	return l
}

// Len is the number of entries.
func (l List) Len() int { return len(l.valid) + len(l.other) }

// String formats the list: comma-separated, no spaces.
func (l List) String() string { return strings.Join(slices.Concat(l.valid, l.other), ",") }

// Invalid returns the entries the list's readers would not understand.
func (l List) Invalid() []string { return slices.Clone(l.other) }

func (f ListFormat) with(l List, add []string) List {
	out := List{valid: slices.Clone(l.valid), other: l.other}
	have := make(map[string]struct{}, len(out.valid))
	for _, e := range out.valid {
		have[e] = struct{}{}
	}
	for _, e := range add {
		if _, ok := have[e]; !ok {
			have[e] = struct{}{}
			out.valid = append(out.valid, e)
		}
	}
	slices.SortFunc(out.valid, f.Compare)
	return out
}

// ListState is gpuhealth's bookkeeping beside a shared list.
type ListState struct {
	Written string `json:"written"`
	Others  string `json:"others"`
}

// ErrBadListState says the state annotation could not be read; every entry then counts as another
// writer's, and the state is rewritten.
var ErrBadListState = errors.New("the state annotation is not valid JSON: every entry of the list is kept as another writer's")

// MergeResult is the outcome of Merge.
type MergeResult struct {
	// Value is the list's new value; "" means the annotation must be absent.
	Value string
	// State is the state annotation's new value (never empty: see the rules above).
	State string
	// Invalid lists entries of the current value the readers would not understand.
	Invalid []string
	// StateErr is ErrBadListState when the recorded state could not be read.
	StateErr error
	// Oversized is the number of entries of the current value when it has more than MaxListEntries
	// (0 otherwise), for a warning.
	Oversized int
}

// Merge applies the package's rules. current and stateRaw are the annotations' values ("" when
// absent); oursWithoutState says that, without a state, the current entries are gpuhealth's own
// (an earlier version owned the list outright); ours are gpuhealth's entries now.
func (f ListFormat) Merge(current, stateRaw string, oursWithoutState bool, ours []string) MergeResult {
	var r MergeResult
	// The API server stores annotations as UTF-8 (JSON turns invalid bytes into U+FFFD); do the
	// same so that what was written compares equal to what is read back.
	current = strings.ToValidUTF8(current, "\uFFFD")
	observed := f.Parse(current)
	r.Invalid = observed.Invalid()
	if n := observed.Len(); n > MaxListEntries {
		r.Oversized = n
	}
	var others List
	var state ListState
	switch {
	case stateRaw != "" && json.Unmarshal([]byte(stateRaw), &state) != nil:
		r.StateErr = ErrBadListState
		others = observed
	case stateRaw != "" && state.Written == current:
		// Unchanged since gpuhealth wrote it: the other writers' share is what it was then.
		others = f.Parse(state.Others)
	case stateRaw != "":
		// Someone else changed it since: their value is their intent.
		others = observed
	case oursWithoutState:
		// Only the invalid entries cannot have been an earlier gpuhealth's.
		others = List{other: observed.other}
	default:
		others = observed
	}
	r.Value = f.with(others, ours).String()
	b, _ := json.Marshal(ListState{Written: r.Value, Others: others.String()}) // cannot fail
	r.State = string(b)
	return r
}
