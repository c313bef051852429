package v1_test

import (
	"strconv"
	"strings"
	"testing"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// indexes is the list format of the cases below.
var indexes = gpuhealthv1.VolcanoIDs

func TestSharedListMerge(t *testing.T) {
	state := func(written, others string) string {
		return `{"written":"` + written + `","others":"` + others + `"}`
	}
	for _, tc := range []struct {
		name                 string
		current, stateRaw    string
		oursWithoutState     bool
		ours                 []string
		wantValue, wantState string
		wantInvalid          string
		wantStateErr         bool
	}{
		{name: "empty, nothing ours: the state says so", wantValue: "", wantState: state("", "")},
		{name: "ours only", ours: []string{"3", "0"}, wantValue: "0,3", wantState: state("0,3", "")},
		{name: "unchanged since our write: others as recorded", current: "0,2", stateRaw: state("0,2", "2"), ours: nil, wantValue: "2", wantState: state("2", "2")},
		{name: "changed by another writer: all its entries are its own", current: "0,5", stateRaw: state("0,2", "2"), ours: []string{"1"}, wantValue: "0,1,5", wantState: state("0,1,5", "0,5")},
		{name: "deleted by another writer", current: "", stateRaw: state("0,2", "2"), ours: []string{"0"}, wantValue: "0", wantState: state("0", "")},
		{name: "no state, an earlier gpuhealth owned the list: its entries go", current: "0,2,x", oursWithoutState: true, ours: []string{"3"}, wantValue: "3,x", wantInvalid: "x", wantState: state("3,x", "x")},
		{name: "no state, never managed here: every entry is another writer's", current: "0,2", ours: []string{"3"}, wantValue: "0,2,3", wantState: state("0,2,3", "0,2")},
		{name: "unchanged and empty: stays empty", current: "", stateRaw: state("", ""), wantValue: "", wantState: state("", "")},
		{name: "written after we emptied it: the other writer's", current: "5", stateRaw: state("", ""), wantValue: "5", wantState: state("5", "5")},
		{name: "invalid entries kept verbatim at the end", current: " 7 ,x,, 7,-1", stateRaw: state("", ""), ours: []string{"1"}, wantValue: "1,7,x,-1", wantInvalid: "x,-1", wantState: state("1,7,x,-1", "7,x,-1")},
		{name: "garbled state: everything is another writer's", current: "4", stateRaw: "{", ours: []string{"1"}, wantValue: "1,4", wantState: state("1,4", "4"), wantStateErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := indexes.Merge(tc.current, tc.stateRaw, tc.oursWithoutState, tc.ours)
			if r.Value != tc.wantValue || r.State != tc.wantState {
				t.Errorf("Merge = value %q state %q, want %q %q", r.Value, r.State, tc.wantValue, tc.wantState)
			}
			if got := strings.Join(r.Invalid, ","); got != tc.wantInvalid {
				t.Errorf("invalid = %q, want %q", got, tc.wantInvalid)
			}
			if (r.StateErr != nil) != tc.wantStateErr {
				t.Errorf("StateErr = %v", r.StateErr)
			}
			// Merging again with what was written changes nothing: no write fight.
			again := indexes.Merge(r.Value, r.State, false, tc.ours)
			if again.Value != r.Value || again.State != r.State {
				t.Errorf("second merge = %q %q, want a fixed point", again.Value, again.State)
			}
		})
	}
}

func FuzzSharedListMergeIsAFixedPoint(f *testing.F) {
	f.Add("0,2", `{"written":"0,2","others":"2"}`, "1")
	f.Add("x,,3", "{", "")
	f.Fuzz(func(t *testing.T, current, stateRaw, ours string) {
		var own []string
		for _, e := range strings.Split(ours, ",") {
			if indexes.Valid(e) {
				own = append(own, e)
			}
		}
		r := indexes.Merge(current, stateRaw, false, own)
		for _, e := range own {
			if !strings.Contains(","+r.Value+",", ","+strings.TrimSpace(e)+",") {
				t.Fatalf("own entry %q missing from %q", e, r.Value)
			}
		}
		again := indexes.Merge(r.Value, r.State, false, own)
		if again.Value != r.Value || again.State != r.State {
			t.Fatalf("not a fixed point: %q/%q then %q/%q", r.Value, r.State, again.Value, again.State)
		}
	})
}

// hostileList is 40,000 entries, half duplicates, as another writer (or an attacker with a
// Node-patching identity) could write.
func hostileList() string {
	parts := make([]string, 0, 40000)
	for i := range 40000 {
		parts = append(parts, strconv.Itoa(i%20000))
	}
	return strings.Join(parts, ",")
}

// TestHostileListIsMergedWhole: a list far longer than any node's GPUs is merged whole (nothing
// of another writer's is dropped), deduplicated, and flagged for a warning.
func TestHostileListIsMergedWhole(t *testing.T) {
	r := indexes.Merge(hostileList(), "", false, []string{"20000"})
	if r.Oversized != 20000 {
		t.Errorf("Oversized = %d, want 20000 entries counted", r.Oversized)
	}
	got := strings.Split(r.Value, ",")
	if len(got) != 20001 || got[0] != "0" || got[19999] != "19999" || got[20000] != "20000" {
		t.Errorf("merged %d entries (%s ... %s)", len(got), got[0], got[len(got)-1])
	}
	if r := indexes.Merge("0,3", "", false, nil); r.Oversized != 0 {
		t.Errorf("a short list is Oversized %d", r.Oversized)
	}
}

// BenchmarkMergeHostileList measures one merge of the 40,000-entry list (it took 4.3 s while
// Parse was quadratic).
func BenchmarkMergeHostileList(b *testing.B) {
	list := hostileList()
	b.ReportAllocs()
	for b.Loop() {
		indexes.Merge(list, "", false, []string{"20000"})
	}
}
