package health_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestCheckpointNotesSayWhatWasLeftOut(t *testing.T) {
	for _, tc := range compatCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			_, notes, err := health.UnmarshalCheckpointNotes(changedFixture(t, tc.change))
			if err != nil {
				t.Fatal(err)
			}
			version := tc.version
			if version == 0 {
				version = health.CheckpointVersion
			}
			if notes.Version != version || !slices.Equal(notes.UnknownFields, tc.unknown) || notes.Skipped != tc.skipped || len(notes.SkipReasons) != tc.skipped {
				t.Errorf("notes %+v, want version %d, unknown fields %q, %d skipped", notes, version, tc.unknown, tc.skipped)
			}
			if notes.Empty() != (version == health.CheckpointVersion && len(tc.unknown) == 0 && tc.skipped == 0) {
				t.Errorf("Empty() = %v for %+v", notes.Empty(), notes)
			}
		})
	}
}

func TestCheckpointNotesOfTheFixtures(t *testing.T) {
	for _, name := range []string{"checkpoint-v1-nocursors.json", "checkpoint-v1.json"} {
		_, notes, err := health.UnmarshalCheckpointNotes(readFixture(t, name))
		if err != nil || !notes.Empty() || notes.Version != 1 {
			t.Errorf("%s: notes %+v, %v; want version 1 and nothing left out", name, notes, err)
		}
	}

	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := os.WriteFile(path, readFixture(t, "checkpoint-next.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, notes, err := health.ReadCheckpointNotes(path)
	if err != nil {
		t.Fatal(err)
	}
	if notes.Version <= health.CheckpointVersion {
		t.Fatalf("checkpoint-next.json is of version %d, not newer than this release's %d: make a new one from the new version's fixture",
			notes.Version, health.CheckpointVersion)
	}
	wantUnknown := []string{
		"data.checks",
		"data.cursors.*.offset",
		"data.devices[].conditions[].bootSeen",
		"data.devices[].conditions[].count",
		"data.devices[].conditions[].ticket",
		"data.devices[].device.boardPartNumber",
		"data.devices[].device.mig.profile",
		"data.devices[].unmonitoredChecks",
		"data.devices[].xids",
		"data.nodeName",
		"writer",
	}
	if !slices.Equal(notes.UnknownFields, wantUnknown) {
		t.Errorf("unknown fields\n got %q\nwant %q", notes.UnknownFields, wantUnknown)
	}
	reasons := strings.Join(notes.SkipReasons, "\n")
	if notes.Skipped != 3 || !strings.Contains(reasons, `"Critical"`) || !strings.Contains(reasons, `"driverReload"`) ||
		!strings.Contains(reasons, `cursor "nvmlEvents"`) || !strings.Contains(reasons, "GPU-0000 condition XID/145") {
		t.Errorf("skipped %d: %q; want the severity, the clearsOn and the cursor this release does not have", notes.Skipped, notes.SkipReasons)
	}
}

func TestCheckpointNotesOfThisReleaseAreEmpty(t *testing.T) {
	b, err := health.MarshalCheckpoint(faultyTracker(t, health.DefaultPolicy()).tr.Checkpoint())
	if err != nil {
		t.Fatal(err)
	}
	if _, notes, err := health.UnmarshalCheckpointNotes(b); err != nil || !notes.Empty() {
		t.Fatalf("notes %+v, %v", notes, err)
	}
}

func TestCheckpointNotesAreBounded(t *testing.T) {
	const n = 100
	var conds []string
	for i := range n {
		conds = append(conds, fmt.Sprintf(`{"type":"XID","code":%d,"severity":"Critical","clearsOn":"admin","f%03d":1}`, i, i))
	}
	conds = append(conds, `{"type":"XID","code":79,"severity":"Unhealthy","clearsOn":"admin"}`)
	data := `{"bootID":"b","devices":[{"device":{"uuid":"GPU-0001"},"conditions":[` + strings.Join(conds, ",") + `]}]}`
	cp, notes, err := health.UnmarshalCheckpointNotes(envelope(t, health.CheckpointVersion+1, data))
	if err != nil {
		t.Fatal(err)
	}
	if notes.Skipped != n || len(notes.SkipReasons) != 16 || len(notes.UnknownFields) != 16 {
		t.Errorf("skipped %d with %d reasons, %d unknown fields; want %d, 16 and 16", notes.Skipped, len(notes.SkipReasons), len(notes.UnknownFields), n)
	}
	h, _ := restoreInto(t, health.DefaultPolicy(), cp, "b", gpuDevice(1))
	if c := h.mustCondition("GPU-0001", health.ConditionXID, 79); c.ClearsOn != health.ClearsOnAdmin {
		t.Errorf("the condition this release can read came back as %+v", c)
	}
}

// TestRuntimeKeepsTheRestoreNotes: an embedder of the Runtime (the device plugin) learns what
// Restore left out of a newer release's checkpoint, to log it.
func TestRuntimeKeepsTheRestoreNotes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := os.WriteFile(path, readFixture(t, "checkpoint-next.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	cp, err := health.ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	var devices []health.Device
	for _, d := range cp.Devices {
		if d.Device.MIG == nil {
			devices = append(devices, d.Device)
		}
	}
	rt, err := health.NewRuntime(health.DefaultPolicy(), devices, health.RuntimeOptions{CheckpointPath: path, BootID: cp.BootID})
	if err != nil {
		t.Fatal(err)
	}
	if restored, err := rt.Restore(); err != nil || !restored {
		t.Fatalf("Restore = %v, %v", restored, err)
	}
	if n := rt.RestoreNotes(); n.Empty() || n.Version <= health.CheckpointVersion {
		t.Errorf("RestoreNotes = %+v, want the newer version and what was left out", n)
	}
}
