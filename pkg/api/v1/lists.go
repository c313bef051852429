package v1

import (
	"cmp"
	"strconv"
	"strings"
)

// VolcanoIDs is the format of UnhealthyIDsKey: GPU indexes, ascending. Volcano's scheduler skips
// entries that do not parse as indexes; a merge keeps them as they are.
var VolcanoIDs = ListFormat{
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

// HAMiUUIDs is the format of HAMiCordonKey: device UUIDs in string order. HAMi's scheduler
// splits on commas and trims; an entry with blanks inside names no device, and a merge keeps it
// as it is.
var HAMiUUIDs = ListFormat{
	Valid:   func(s string) bool { return !strings.ContainsAny(s, " \t") },
	Compare: strings.Compare,
}

// MergeUnhealthyIDs merges ours, the indexes gpuhealth finds Unhealthy now, into UnhealthyIDsKey
// as a Node's annotations have it, under VolcanoStateKey's bookkeeping. The key has other
// writers: Volcano's device plugin, which deletes it when it starts and adds indexes on XIDs but
// never removes one, and operators (docs/compatibility.md).
func MergeUnhealthyIDs(annotations map[string]string, ours []int) MergeResult {
	own := make([]string, len(ours))
	for i, v := range ours {
		own[i] = strconv.Itoa(v)
	}
	// Before this bookkeeping, gpuhealth owned the key outright (it overwrote any other writer):
	// where its health annotation exists but no state, the key's entries are its own.
	_, hadGPUHealth := annotations[HealthKey]
	return VolcanoIDs.Merge(annotations[UnhealthyIDsKey], annotations[VolcanoStateKey], hadGPUHealth, own)
}

// MergeCordon merges ours, the UUIDs gpuhealth cordons now, into HAMiCordonKey as a Node's
// annotations have it, under HAMiStateKey's bookkeeping. Without a state every entry is an
// operator's: gpuhealth never owned this key outright.
func MergeCordon(annotations map[string]string, ours []string) MergeResult {
	return HAMiUUIDs.Merge(annotations[HAMiCordonKey], annotations[HAMiStateKey], false, ours)
}
