package health

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Decoding checkpoints of any release: what this one wrote, what earlier ones wrote, and what a
// later one adds (unknown fields, versions and entries are skipped and noted, never fatal), so
// that neither an upgrade nor a rollback loses a fault.

// CheckpointNotes says what decoding a checkpoint left out. For a checkpoint this release or an
// older one wrote, only Version is set; one a newer release wrote may hold fields and entries
// this release does not know, and everything else in it is restored all the same.
type CheckpointNotes struct {
	// Version is the format version the file names; above CheckpointVersion, a newer release
	// wrote it.
	Version int
	// UnknownFields are the fields this release does not know, as paths under the envelope
	// ("data.devices[].conditions[].count"), sorted, at most 16; their values are ignored.
	UnknownFields []string
	// Skipped counts the entries (a device, a condition, a cursor) this release cannot
	// represent, such as a condition whose severity or clearsOn it does not have.
	Skipped int
	// SkipReasons says where and why, for the first 16 skipped entries.
	SkipReasons []string
}

// Empty reports whether nothing was left out.
func (n CheckpointNotes) Empty() bool {
	return n.Version <= CheckpointVersion && len(n.UnknownFields) == 0 && n.Skipped == 0
}

// UnmarshalCheckpoint decodes and verifies a checkpoint file's contents, as
// UnmarshalCheckpointNotes does, without the notes.
func UnmarshalCheckpoint(b []byte) (Checkpoint, error) {
	cp, _, err := UnmarshalCheckpointNotes(b)
	return cp, err
}

// UnmarshalCheckpointNotes decodes and verifies a checkpoint file's contents, of any format
// version: what this release does not know is left out and listed in the notes, not an error
// (see CheckpointVersion). Any problem with the file itself wraps ErrCorruptCheckpoint.
func UnmarshalCheckpointNotes(b []byte) (Checkpoint, CheckpointNotes, error) {
	corrupt := func(err error) (Checkpoint, CheckpointNotes, error) {
		return Checkpoint{}, CheckpointNotes{}, fmt.Errorf("%w: %w", ErrCorruptCheckpoint, err)
	}
	var f checkpointFile
	if err := json.Unmarshal(b, &f); err != nil {
		return corrupt(err)
	}
	if f.Version < 1 {
		return corrupt(fmt.Errorf("version %d, want 1 or later", f.Version))
	}
	// MarshalIndent re-indents the raw data; compact it back to the bytes that were summed.
	var data bytes.Buffer
	if err := json.Compact(&data, f.Data); err != nil {
		return corrupt(err)
	}
	sum := sha256.Sum256(data.Bytes())
	if want, ok := strings.CutPrefix(f.Checksum, "sha256:"); !ok || want != hex.EncodeToString(sum[:]) {
		return corrupt(errors.New("checksum mismatch"))
	}
	d := checkpointDecoder{notes: CheckpointNotes{Version: f.Version}, unknown: map[string]bool{}}
	cp, err := d.checkpoint(data.Bytes())
	if err != nil {
		return corrupt(err)
	}
	d.unknownFields(b, reflect.TypeFor[checkpointFile](), "")
	d.unknownFields(data.Bytes(), reflect.TypeFor[Checkpoint](), "data")
	for path := range d.unknown {
		d.notes.UnknownFields = append(d.notes.UnknownFields, path)
	}
	slices.Sort(d.notes.UnknownFields)
	if len(d.notes.UnknownFields) > maxNoteEntries {
		d.notes.UnknownFields = d.notes.UnknownFields[:maxNoteEntries]
	}
	return cp, d.notes, nil
}

// checkpointDecoder decodes a checkpoint's data entry by entry, so that one entry this release
// cannot represent costs that entry and not the checkpoint.
type checkpointDecoder struct {
	notes   CheckpointNotes
	unknown map[string]bool // paths of unknown fields
}

func (d *checkpointDecoder) skip(format string, args ...any) {
	d.notes.Skipped++
	if len(d.notes.SkipReasons) < maxNoteEntries {
		d.notes.SkipReasons = append(d.notes.SkipReasons, fmt.Sprintf(format, args...))
	}
}

// checkpoint decodes a Checkpoint. The frame (boot ID, time, a list of devices, a map of cursors)
// is the same in every version, so a frame that does not decode is an error; a device, condition
// or cursor that does not is skipped. Empty lists and maps stay empty, not nil, as they were
// written.
func (d *checkpointDecoder) checkpoint(b []byte) (Checkpoint, error) {
	var frame struct {
		BootID  string                     `json:"bootID"`
		Time    time.Time                  `json:"time"`
		Devices []json.RawMessage          `json:"devices"`
		Cursors map[string]json.RawMessage `json:"cursors"`
		// Requests are version 5's.
		Requests map[string]json.RawMessage `json:"requests"`
	}
	if err := json.Unmarshal(b, &frame); err != nil {
		return Checkpoint{}, err
	}
	cp := Checkpoint{BootID: frame.BootID, Time: frame.Time}
	if frame.Devices != nil {
		cp.Devices = make([]CheckpointedDevice, 0, len(frame.Devices))
	}
	for i, raw := range frame.Devices {
		if cd, ok := d.device(i, raw); ok {
			cp.Devices = append(cp.Devices, cd)
		}
	}
	if frame.Cursors != nil {
		cp.Cursors = make(map[string]Cursor, len(frame.Cursors))
	}
	for _, name := range slices.Sorted(maps.Keys(frame.Cursors)) {
		var c Cursor
		if err := json.Unmarshal(frame.Cursors[name], &c); err != nil {
			d.skip("cursor %q: %v", name, err)
			continue
		}
		cp.Cursors[name] = c
	}
	for _, key := range slices.Sorted(maps.Keys(frame.Requests)) {
		var at time.Time
		if err := json.Unmarshal(frame.Requests[key], &at); err != nil {
			d.skip("request %q: %v", key, err)
			continue
		}
		if cp.Requests == nil {
			cp.Requests = make(map[string]time.Time, len(frame.Requests))
		}
		cp.Requests[key] = at
	}
	return cp, nil
}

// device decodes devices[i]. An entry without a device keeps the zero Device, which Restore
// refuses as it always has: that is damage, not a newer format.
func (d *checkpointDecoder) device(i int, b []byte) (CheckpointedDevice, bool) {
	var entry struct {
		Device     json.RawMessage   `json:"device"`
		Conditions []json.RawMessage `json:"conditions"`
		History    []json.RawMessage `json:"history"`
	}
	if err := json.Unmarshal(b, &entry); err != nil {
		d.skip("devices[%d]: %v", i, err)
		return CheckpointedDevice{}, false
	}
	var cd CheckpointedDevice
	if len(entry.Device) > 0 {
		if err := json.Unmarshal(entry.Device, &cd.Device); err != nil {
			d.skip("devices[%d] and its %d conditions: %v", i, len(entry.Conditions), err)
			return CheckpointedDevice{}, false
		}
	}
	if entry.Conditions != nil {
		cd.Conditions = make([]Condition, 0, len(entry.Conditions))
	}
	for j, raw := range entry.Conditions {
		var c Condition
		if err := json.Unmarshal(raw, &c); err != nil {
			var id struct {
				Type string `json:"type"`
				Code uint32 `json:"code"`
			}
			_ = json.Unmarshal(raw, &id) // best effort, for the note
			d.skip("device %s condition %s/%d (devices[%d].conditions[%d]): %v", cd.Device.UUID, id.Type, id.Code, i, j, err)
			continue
		}
		cd.Conditions = append(cd.Conditions, c)
	}
	for j, raw := range entry.History {
		var h HistoryEntry
		if err := json.Unmarshal(raw, &h); err != nil {
			d.skip("device %s history entry %d (devices[%d].history[%d]): %v", cd.Device.UUID, j, i, j, err)
			continue
		}
		switch h.Kind {
		case HistoryFault, HistoryReset, HistoryReboot, HistoryCleared, HistoryValidation:
			cd.History = append(cd.History, h)
		default:
			d.skip("device %s history entry %d (devices[%d].history[%d]): unknown kind %q", cd.Device.UUID, j, i, j, h.Kind)
		}
	}
	return cd, true
}

// unknownFields records, as paths under path, the keys of the JSON objects in b that t (the Go
// type b decodes into) has no field for: encoding/json ignores them, and the notes name them.
// Keys match fields as encoding/json matches them, ignoring case.
func (d *checkpointDecoder) unknownFields(b []byte, t reflect.Type, path string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pt := reflect.PointerTo(t)
	if pt.Implements(reflect.TypeFor[json.Unmarshaler]()) || pt.Implements(reflect.TypeFor[encoding.TextUnmarshaler]()) {
		return // a value, not an object of fields (a time, a severity, raw data)
	}
	switch t.Kind() {
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if json.Unmarshal(b, &obj) != nil {
			return // not an object: decoding says so
		}
		for key, v := range obj {
			name, ft, ok := jsonField(t, key)
			if !ok {
				d.unknown[strings.TrimPrefix(path+"."+key, ".")] = true
				continue
			}
			d.unknownFields(v, ft, strings.TrimPrefix(path+"."+name, "."))
		}
	case reflect.Slice:
		var items []json.RawMessage
		if json.Unmarshal(b, &items) != nil {
			return
		}
		for _, v := range items {
			d.unknownFields(v, t.Elem(), path+"[]")
		}
	case reflect.Map:
		var obj map[string]json.RawMessage
		if json.Unmarshal(b, &obj) != nil {
			return
		}
		for _, v := range obj {
			d.unknownFields(v, t.Elem(), path+".*")
		}
	}
}

// jsonField finds the exported field of struct type t that encoding/json decodes key into.
func jsonField(t reflect.Type, key string) (name string, typ reflect.Type, ok bool) {
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		if strings.EqualFold(name, key) {
			return name, f.Type, true
		}
	}
	return "", nil, false
}
