package annotation

import (
	"cmp"
	"strconv"

	"github.com/gpuhealth/gpuhealth/internal/report/sharedlist"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// gpuhealthv1.VolcanoStateKey records gpuhealth's share of volcano.sh/gpu-unhealthy-ids (package sharedlist),
// because that key has other writers: Volcano's own device plugin (which deletes the key when it
// starts and writes its own list of indexes when it sees XIDs, never removing one) and operators.
// The value is JSON:
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
// Without a state, the key's entries count as gpuhealth's own where gpuhealth's health annotation
// exists (an earlier version owned the key outright: the start-up reconcile clears what it left
// stale), and as other writers' where it does not (gpuhealth never ran on the node). The state
// stays once written, also when the key is absent.
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
