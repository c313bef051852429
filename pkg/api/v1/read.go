package v1

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Readers of the annotations as the schedulers read them: lenient, per entry. A reader never
// fails and never panics on what it finds on a Node: an entry it cannot use is skipped and
// described through warn (which may be nil), and the rest still count. warn gets a format and
// its arguments, so that a caller that caps its warnings formats none it drops. The strict
// parsers (ParseHealth, ParseDrains) are for gpuhealth's own round trips, where a bad value is an
// error.

// Warn receives one problem with an annotation's value or one of its entries.
type Warn func(format string, args ...any)

func (w Warn) say(format string, args ...any) {
	if w != nil {
		w(format, args...)
	}
}

// Short quotes a value for a warning: cut to a readable length and safe for any bytes.
func Short(s string) string {
	const limit = 40
	if len(s) > limit {
		// Quote escapes any invalid UTF-8 the cut leaves.
		return strconv.Quote(s[:limit]) + "..."
	}
	return strconv.Quote(s)
}

// ReadUnhealthyIDs reads UnhealthyIDsKey's value the way Volcano's scheduler does (split on
// commas, parse each entry, skip bad ones), also skipping indexes outside 0..count-1.
func ReadUnhealthyIDs(v string, count int, warn Warn) []int {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	var out []int
	for entry := range strings.SplitSeq(v, ",") {
		s := strings.TrimSpace(entry)
		i, err := strconv.Atoi(s)
		switch {
		case err != nil:
			warn.say("entry %s is not an index: ignored", Short(s))
		case i < 0 || i >= count:
			warn.say("index %d is out of range (the node has %d GPUs): ignored", i, count)
		default:
			out = append(out, i)
		}
	}
	return out
}

// ReadCordon reads HAMiCordonKey's value the way HAMi's scheduler does: split on commas, trim,
// skip empty entries. Each entry is a device ID, which is a GPU UUID.
func ReadCordon(v string) []string {
	var out []string
	for entry := range strings.SplitSeq(v, ",") {
		if uuid := strings.TrimSpace(entry); uuid != "" {
			out = append(out, uuid)
		}
	}
	return out
}

// HealthEntry is what a scheduler reads of one device of HealthKey's value: where it is and how
// healthy. An entry is read for these fields alone, so a field a scheduler does not use (a
// reason, a history) never costs it the entry; ParseHealth reads the whole GPUSummary.
type HealthEntry struct {
	UUID string
	// Index is the GPU's index on the node (-1 for a Missing placeholder).
	Index  int
	Health health.Severity
	// ParentUUID is the card a MIG instance belongs to; empty for a whole GPU.
	ParentUUID string
	// Missing marks a GPU the node should have and the driver does not answer for.
	Missing bool
}

// healthFields are the fields of a GPUSummary that HealthEntry carries, as they are on the wire.
type healthFields struct {
	Index      int    `json:"index"`
	Health     string `json:"health"`
	ParentUUID string `json:"parentUUID"`
	Missing    bool   `json:"missing"`
}

// ReadHealth reads HealthKey's value: the entries that decode and name a known health, sorted by
// UUID (so that duplicates resolve the same way every time).
func ReadHealth(v string, warn Warn) []HealthEntry {
	return readEntries(v, warn, func(uuid string, f healthFields) (HealthEntry, bool) {
		sev, err := health.ParseSeverity(f.Health)
		if err != nil {
			warn.say("entry %s: unknown health %s: ignored", Short(uuid), Short(f.Health))
			return HealthEntry{}, false
		}
		return HealthEntry{UUID: uuid, Index: f.Index, Health: sev, ParentUUID: f.ParentUUID, Missing: f.Missing}, true
	})
}

// DrainEntry is one GPU of DrainsKey's value.
type DrainEntry struct {
	UUID string
	Drain
}

// ReadDrains reads DrainsKey's value: the entries that decode, sorted by UUID.
func ReadDrains(v string, warn Warn) []DrainEntry {
	return readEntries(v, warn, func(uuid string, d Drain) (DrainEntry, bool) { return DrainEntry{UUID: uuid, Drain: d}, true })
}

// readEntries decodes v, a JSON object keyed by UUID, and returns, in UUID order, what keep makes
// of each entry that decodes as T and that it keeps; a value that is not an object (nil is
// returned), and each entry that does not decode, is a warning.
func readEntries[T, E any](v string, warn Warn, keep func(uuid string, entry T) (E, bool)) []E {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(v), &raw); err != nil {
		warn.say("not a JSON object (%v): ignored", err)
		return nil
	}
	out := make([]E, 0, len(raw))
	for _, uuid := range slices.Sorted(maps.Keys(raw)) {
		var entry T
		if err := json.Unmarshal(raw[uuid], &entry); err != nil {
			warn.say("entry %s: %v: ignored", Short(uuid), err)
			continue
		}
		if e, ok := keep(uuid, entry); ok {
			out = append(out, e)
		}
	}
	return out
}
