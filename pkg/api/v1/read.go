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

// HealthEntry is one device of HealthKey's value.
type HealthEntry struct {
	UUID string
	GPUSummary
}

// ReadHealth reads HealthKey's value: the entries that decode and name a known health, sorted by
// UUID (so that duplicates resolve the same way every time).
func ReadHealth(v string, warn Warn) []HealthEntry {
	var out []HealthEntry
	readEntries(v, warn, func(uuid string, s GPUSummary) {
		if _, err := health.ParseSeverity(s.Health); err != nil {
			warn.say("entry %s: unknown health %s: ignored", Short(uuid), Short(s.Health))
			return
		}
		out = append(out, HealthEntry{UUID: uuid, GPUSummary: s})
	})
	return out
}

// DrainEntry is one GPU of DrainsKey's value.
type DrainEntry struct {
	UUID string
	Drain
}

// ReadDrains reads DrainsKey's value: the entries that decode, sorted by UUID.
func ReadDrains(v string, warn Warn) []DrainEntry {
	var out []DrainEntry
	readEntries(v, warn, func(uuid string, d Drain) { out = append(out, DrainEntry{UUID: uuid, Drain: d}) })
	return out
}

// readEntries decodes v, a JSON object keyed by UUID, and hands each entry that decodes as T to
// use, in UUID order; a value that is not an object, and each entry that does not decode, is a
// warning.
func readEntries[T any](v string, warn Warn, use func(uuid string, entry T)) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(v), &raw); err != nil {
		warn.say("not a JSON object (%v): ignored", err)
		return
	}
	for _, uuid := range slices.Sorted(maps.Keys(raw)) {
		var entry T
		if err := json.Unmarshal(raw[uuid], &entry); err != nil {
			warn.say("entry %s: %v: ignored", Short(uuid), err)
			continue
		}
		use(uuid, entry)
	}
}
