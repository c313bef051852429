package health

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// CheckpointVersion is the version of the checkpoint format this package writes. Every release
// reads every version from 1 up, so that a rollback keeps the faults a newer release saved: a
// release that adds to the format (a field, a condition type, a severity or clearsOn value, a
// cursor of another shape) raises the version and keeps the envelope (version, a sha256 checksum
// of data, data) and the meaning of every field already there; a reader ignores the fields it
// does not know, skips the entries it cannot represent, restores the rest and says what it left
// out (CheckpointNotes). testdata/checkpoint-v*.json hold what each version looks like.
const CheckpointVersion = 7

// RestoredFromReportNote ends the message of a condition an agent rebuilt from its Node's own
// report (it had no checkpoint): readers that key on a message's text (NVSentinel merges equal
// texts) strip it, so that a restored fault reads as the one before the restart.
const RestoredFromReportNote = " (restored from the node's gpu-health annotation)"

// ErrCorruptCheckpoint is wrapped by ReadCheckpoint when the file exists but cannot be trusted:
// not JSON, a wrong checksum, no version, or data without the shape every version shares.
// Callers report it and start without the checkpoint; it is never fatal.
var ErrCorruptCheckpoint = errors.New("corrupt checkpoint")

// maxNoteEntries bounds the lists in CheckpointNotes, so that a log line stays readable.
const maxNoteEntries = 16

// Checkpoint is the part of a Tracker's state that must outlive the process: sticky conditions
// (everything except those a polled reading re-establishes) and the boot they belong to.
type Checkpoint struct {
	BootID  string               `json:"bootID"`
	Time    time.Time            `json:"time"`
	Devices []CheckpointedDevice `json:"devices"`
	// Cursors says, per replayable source (the kernel log), how far its records were applied
	// to Devices; absent from checkpoints written before sources had cursors.
	Cursors map[string]Cursor `json:"cursors,omitempty"`
	// Requests are the operators' requests applied (version 5 and later), by the key their
	// applier gave them, with the time each was written: a restart does not apply them again
	// (Tracker.RequestApplied).
	Requests map[string]time.Time `json:"requests,omitempty"`
}

// CheckpointedDevice is one device's sticky conditions. The identity is kept so that a GPU
// missing at restart (fallen off the bus) is still reported rather than forgotten.
type CheckpointedDevice struct {
	Device     Device      `json:"device"`
	Conditions []Condition `json:"conditions"`
	// History is a physical GPU's faults and repairs (version 2 and later), so that a GPU
	// whose fault keeps returning is known across restarts and reboots.
	History []HistoryEntry `json:"history,omitempty"`
}

// checkpointFile is the on-disk envelope: the checksum covers the exact bytes of Data.
type checkpointFile struct {
	Version  int             `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// sticky reports whether a condition belongs in a checkpoint. Conditions that clear when a
// reading recovers are re-established by the next sample and are left out.
func sticky(c Condition) bool { return c.ClearsOn != ClearsOnRecovered }

// Checkpoint returns the tracker's sticky state. Devices without sticky conditions are omitted.
func (t *Tracker) Checkpoint() Checkpoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	cp := Checkpoint{BootID: t.bootID, Time: t.lastTime, Cursors: maps.Clone(t.cursors), Requests: maps.Clone(t.requests)}
	for _, ds := range t.ordered {
		var conds []Condition
		for _, c := range ds.conds {
			if sticky(c.Condition) {
				conds = append(conds, c.Condition)
			}
		}
		if len(conds) > 0 || len(ds.history) > 0 {
			if conds == nil {
				conds = []Condition{}
			}
			cp.Devices = append(cp.Devices, CheckpointedDevice{Device: ds.dev, Conditions: conds, History: slices.Clone(ds.history)})
		}
	}
	return cp
}

// Restore loads a checkpoint taken by an earlier process. When cp was taken in the same boot
// (bootID equal), its conditions come back as they were; after a reboot, only conditions a
// reboot does not clear come back. Devices in the checkpoint that the tracker does not know are
// added, so that a GPU that disappeared keeps its faults instead of vanishing (a MIG instance
// whose GPU vanished too brings back a bare entry for that GPU). Restore sets the tracker's boot
// ID to bootID and appends the resulting transitions to out. A checkpoint that cannot be applied
// as a whole is rejected with an error wrapping ErrCorruptCheckpoint and changes no device.
func (t *Tracker) Restore(cp Checkpoint, bootID string, now time.Time, out []Transition) ([]Transition, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bootID = bootID
	rebooted := cp.BootID != bootID
	keep := func(c Condition) bool { return !rebooted || !c.ClearsOn.ClearedByReboot() }
	added, err := t.restoredDevicesLocked(cp, keep)
	if err != nil {
		return out, fmt.Errorf("%w: %w", ErrCorruptCheckpoint, err)
	}
	// Cursors come back whatever the boot: each names its own, and a source ignores one of
	// another boot.
	for name, c := range cp.Cursors {
		t.setCursorLocked(name, c)
	}
	// So do the requests applied: they are the Node's, not the boot's.
	for key, at := range cp.Requests {
		t.rememberRequestLocked(key, at, now)
	}
	for _, d := range added {
		if err := t.addLocked(d); err != nil {
			return out, err // unreachable: restoredDevicesLocked checked it
		}
	}
	if len(added) > 0 {
		if err := t.linkLocked(); err != nil {
			return out, err // unreachable: restoredDevicesLocked checked it
		}
	}
	ev := evaluation{t: t, now: now, out: out, restoring: true}
	ev.out = t.markMissingOnce(&ev)
	for _, cd := range cp.Devices {
		ds, ok := t.devices[cd.Device.UUID]
		if !ok {
			continue
		}
		if ds.parent == nil && len(cd.History) > 0 && len(ds.history) == 0 {
			ds.history = slices.Clone(cd.History[max(0, len(cd.History)-MaxHistory):])
			if rebooted {
				if ds.faultPending() {
					t.rebootRepaired = append(t.rebootRepaired, ds.dev.UUID)
				}
				ds.recordRepair(HistoryReboot, now)
			}
		}
		for _, c := range cd.Conditions {
			if !keep(c) {
				continue
			}
			if i := ds.find(c.Type, c.Code); i >= 0 {
				if ds.conds[i].Severity >= c.Severity {
					continue
				}
				ds.conds[i].Condition = c
			} else {
				ds.conds = append(ds.conds, condState{Condition: c})
			}
			t.generation++
			ev.refresh(ds, "")
		}
	}
	return ev.out, nil
}

// restoredDevicesLocked checks everything Restore will apply and returns the devices it must
// add, parents before their MIG instances, without changing the tracker.
func (t *Tracker) restoredDevicesLocked(cp Checkpoint, keep func(Condition) bool) ([]Device, error) {
	var added []Device
	byUUID := map[string]Device{}
	for _, cd := range cp.Devices {
		if cd.Device.UUID == "" {
			return nil, fmt.Errorf("device with index %d has no UUID", cd.Device.Index)
		}
		kept := false
		for _, c := range cd.Conditions {
			if !keep(c) {
				continue
			}
			if c.Type == "" {
				return nil, fmt.Errorf("device %s has a condition without a type", cd.Device.UUID)
			}
			kept = true
		}
		_, known := t.devices[cd.Device.UUID]
		_, dup := byUUID[cd.Device.UUID]
		// A placeholder for a missing GPU comes back only if the GPU is missing still, which
		// the inventory of this start says (it has the placeholder then): one that is back is
		// not held missing by a checkpoint.
		if !kept || known || dup || cd.Device.Missing {
			continue
		}
		byUUID[cd.Device.UUID] = cd.Device
		added = append(added, cd.Device)
	}
	var parents []Device
	for _, d := range added {
		if d.MIG == nil {
			continue
		}
		pu := d.MIG.ParentUUID
		if pu == "" || pu == d.UUID {
			return nil, fmt.Errorf("MIG device %q has no parent GPU", d.UUID)
		}
		parent, ok := byUUID[pu]
		if ds, known := t.devices[pu]; known {
			parent, ok = ds.dev, true
		}
		if !ok {
			// The GPU vanished with its instance and had nothing sticky of its own.
			parent = Device{UUID: pu, Index: d.Index, Minor: d.Minor}
			for _, cd := range cp.Devices {
				if cd.Device.UUID == pu {
					parent = cd.Device
				}
			}
			byUUID[pu] = parent
			parents = append(parents, parent)
		}
		if parent.MIG != nil {
			return nil, fmt.Errorf("MIG device %q names another MIG device %q as parent", d.UUID, pu)
		}
	}
	return append(parents, added...), nil
}

// MarshalCheckpoint encodes cp in the versioned, checksummed file format.
func MarshalCheckpoint(cp Checkpoint) ([]byte, error) {
	data, err := json.Marshal(cp)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	return json.MarshalIndent(checkpointFile{Version: CheckpointVersion, Checksum: "sha256:" + hex.EncodeToString(sum[:]), Data: data}, "", "  ")
}

// WriteCheckpoint writes cp to path atomically: a temporary file in the same directory is
// written, synced and renamed over path, so a crash leaves either the old or the new file.
func WriteCheckpoint(path string, cp Checkpoint) error {
	b, err := MarshalCheckpoint(cp)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create checkpoint directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace checkpoint: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // make the rename durable; not all filesystems support it
		d.Close()
	}
	return nil
}

// ReadCheckpoint reads a checkpoint file. A missing file returns an error satisfying
// errors.Is(err, fs.ErrNotExist); an untrustworthy one wraps ErrCorruptCheckpoint.
func ReadCheckpoint(path string) (Checkpoint, error) {
	cp, _, err := ReadCheckpointNotes(path)
	return cp, err
}

// ReadCheckpointNotes reads a checkpoint file as ReadCheckpoint does, and says what it left out
// (see UnmarshalCheckpointNotes): an embedder logs non-empty notes.
func ReadCheckpointNotes(path string) (Checkpoint, CheckpointNotes, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Checkpoint{}, CheckpointNotes{}, err
	}
	cp, notes, err := UnmarshalCheckpointNotes(b)
	if err != nil {
		return Checkpoint{}, CheckpointNotes{}, fmt.Errorf("%s: %w", path, err)
	}
	return cp, notes, nil
}

// ReadBootID returns the kernel's boot ID (/proc/sys/kernel/random/boot_id on Linux), which
// changes at every boot.
func ReadBootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read boot ID: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
