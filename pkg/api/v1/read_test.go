package v1_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// collect returns a Warn that keeps what it is told.
func collect(into *[]string) gpuhealthv1.Warn {
	return func(format string, args ...any) { *into = append(*into, fmt.Sprintf(format, args...)) }
}

// The readers never fail: what they cannot use is skipped with a warning, the rest counts; what
// the reporters write reads back as written.
func TestReadersSkipBadEntriesAndKeepTheRest(t *testing.T) {
	t.Run("unhealthy ids", func(t *testing.T) {
		var warned []string
		got := gpuhealthv1.ReadUnhealthyIDs(" 3,x,,-1, 9,0", 8, collect(&warned))
		if !slices.Equal(got, []int{3, 0}) {
			t.Errorf("ids = %v, want [3 0] (Volcano's order: as listed)", got)
		}
		if len(warned) != 4 || !strings.Contains(warned[0], `"x"`) || !strings.Contains(warned[3], "index 9 is out of range") {
			t.Errorf("warnings %q, want x, the empty entry, -1 and 9 named", warned)
		}
		if got := gpuhealthv1.ReadUnhealthyIDs("  ", 8, nil); got != nil {
			t.Errorf("blank value: %v, want none", got)
		}
	})
	t.Run("the merged list reads back", func(t *testing.T) {
		m := gpuhealthv1.MergeUnhealthyIDs(map[string]string{gpuhealthv1.UnhealthyIDsKey: "5,junk"}, []int{3, 1})
		if got := gpuhealthv1.ReadUnhealthyIDs(m.Value, 8, nil); !slices.Equal(got, []int{1, 3, 5}) {
			t.Errorf("read %v from %q, want [1 3 5]", got, m.Value)
		}
		c := gpuhealthv1.MergeCordon(map[string]string{gpuhealthv1.HAMiCordonKey: " GPU-op ,"}, []string{"GPU-b"})
		if got := gpuhealthv1.ReadCordon(c.Value); !slices.Equal(got, []string{"GPU-b", "GPU-op"}) {
			t.Errorf("read %v from %q", got, c.Value)
		}
	})
	t.Run("health", func(t *testing.T) {
		var warned []string
		got := gpuhealthv1.ReadHealth(`{"GPU-b":{"index":1,"health":"Degraded"},"GPU-a":{"index":0,"health":"Unhealthy"},"GPU-c":{"health":"Sick"},"GPU-d":7}`, collect(&warned))
		var uuids []string
		for _, e := range got {
			uuids = append(uuids, e.UUID+"="+e.Health.String())
		}
		if !slices.Equal(uuids, []string{"GPU-a=Unhealthy", "GPU-b=Degraded"}) {
			t.Errorf("entries %v, want GPU-a and GPU-b in UUID order", uuids)
		}
		if len(warned) != 2 || !strings.Contains(warned[0], `"GPU-c": unknown health "Sick"`) || !strings.Contains(warned[1], `"GPU-d"`) {
			t.Errorf("warnings %q", warned)
		}
		warned = nil
		if got := gpuhealthv1.ReadHealth("[", collect(&warned)); got != nil || len(warned) != 1 {
			t.Errorf("not JSON: %v, warnings %q", got, warned)
		}
	})
	t.Run("drains", func(t *testing.T) {
		var warned []string
		got := gpuhealthv1.ReadDrains(`{"GPU-z":{"index":2,"by":"ops"},"GPU-y":"no"}`, collect(&warned))
		if len(got) != 1 || got[0].UUID != "GPU-z" || got[0].Index != 2 || got[0].By != "ops" {
			t.Errorf("drains %+v", got)
		}
		if len(warned) != 1 || !strings.Contains(warned[0], `"GPU-y"`) {
			t.Errorf("warnings %q", warned)
		}
	})
	t.Run("a long value is cut in warnings", func(t *testing.T) {
		if s := gpuhealthv1.Short(strings.Repeat("x", 100)); len(s) > 50 || !strings.HasSuffix(s, "...") {
			t.Errorf("Short = %s", s)
		}
	})
}
