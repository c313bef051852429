package annotation

import (
	"cmp"
	"strconv"

	"github.com/gpuhealth/gpuhealth/internal/report/sharedlist"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// Volcano's list, volcano.sh/gpu-unhealthy-ids, has other writers (Volcano's device plugin,
// which deletes the key when it starts and adds indexes on XIDs but never removes one, and
// operators): gpuhealth merges its share under package sharedlist's rules, its state in
// gpuhealthv1.VolcanoStateKey (docs/compatibility.md).

// volcanoIDs is the format of volcano.sh/gpu-unhealthy-ids: GPU indexes, ascending. Volcano's
// scheduler skips entries that do not parse as indexes; they are kept as they are.
var volcanoIDs = sharedlist.Format{
	Valid: func(s string) bool {
		i, err := strconv.Atoi(s)
		return err == nil && i >= 0
	},
	Compare: func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return cmp.Compare(x, y)
	},
}

// mergeVolcanoIDs applies the rules of VolcanoStateKey to the Node's current annotations and the
// indexes gpuhealth finds Unhealthy now.
func mergeVolcanoIDs(annotations map[string]string, ours []int) sharedlist.Result {
	own := make([]string, len(ours))
	for i, v := range ours {
		own[i] = strconv.Itoa(v)
	}
	// Before this bookkeeping, gpuhealth owned the key outright (it overwrote any other writer):
	// where its health annotation exists but no state, the key's entries are its own.
	_, hadGPUHealth := annotations[gpuhealthv1.HealthKey]
	return volcanoIDs.Merge(annotations[gpuhealthv1.UnhealthyIDsKey], annotations[gpuhealthv1.VolcanoStateKey], hadGPUHealth, own)
}
