package health_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// faultyTracker returns a tracker of GPUs 0..2 (GPU 2 with two MIG instances) holding one of each
// kind of condition: sticky ones that a reset, a reboot, a quiet period or an admin clears, and
// polled ones that the next sample re-establishes.
func faultyTracker(t *testing.T, p *health.Policy) *harness {
	t.Helper()
	h := newHarness(t, p, gpuDevice(0), gpuDevice(1), gpuDevice(2), migDevice(2, 1, 0), migDevice(2, 2, 0))
	h.tr.SetBootID("boot-1")
	g0, g1, g2 := gpuDevice(0).UUID, gpuDevice(1).UUID, gpuDevice(2).UUID
	h.xid(g0, 48, time.Second)                                           // gpuReset
	h.xid(g0, 92, 2*time.Second)                                         // quietPeriod
	h.signal(health.SignalTemperature, g0, 3*time.Second, withValue(99)) // recovered: not sticky
	h.xid(g1, 79, 4*time.Second)                                         // nodeReboot, evict
	h.signal(health.SignalXID, g2, 5*time.Second, withXID(62), withScope(2, health.NoInstance))
	return h
}

func TestCheckpointRoundTripThroughAFile(t *testing.T) {
	h := faultyTracker(t, health.DefaultPolicy())
	cp := h.tr.Checkpoint()
	if cp.BootID != "boot-1" || !cp.Time.Equal(at(5*time.Second)) {
		t.Fatalf("checkpoint boot %q time %v", cp.BootID, cp.Time)
	}
	var types []string
	for _, d := range cp.Devices {
		for _, c := range d.Conditions {
			types = append(types, fmt.Sprintf("%s:%s/%d", d.Device.UUID, c.Type, c.Code))
		}
	}
	want := []string{
		gpuDevice(0).UUID + ":XID/48", gpuDevice(0).UUID + ":XID/92",
		gpuDevice(1).UUID + ":XID/79",
		migDevice(2, 2, 0).UUID + ":XID/62",
	}
	if !reflect.DeepEqual(types, want) {
		t.Fatalf("checkpointed conditions %q, want %q (polled conditions are not sticky)", types, want)
	}

	dir := filepath.Join(t.TempDir(), "state", "nested")
	path := filepath.Join(dir, "checkpoint.json")
	for i := range 3 { // writing over an existing checkpoint works the same way
		if err := health.WriteCheckpoint(path, cp); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	got, err := health.ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cp) {
		t.Fatalf("read back\n%+v\nwant\n%+v", got, cp)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "checkpoint.json" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("directory holds %q, want only checkpoint.json (no temporary files)", names)
	}
}

func TestWriteCheckpointFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The "directory" is a file: nothing can be written, and the error says so.
	if err := health.WriteCheckpoint(filepath.Join(blocker, "checkpoint.json"), health.Checkpoint{}); err == nil {
		t.Fatal("WriteCheckpoint under a regular file succeeded")
	}
	// The target is a directory: the rename fails and no temporary file is left behind.
	target := filepath.Join(dir, "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := health.WriteCheckpoint(target, health.Checkpoint{BootID: "b"}); err == nil {
		t.Fatal("WriteCheckpoint over a non-empty directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("directory holds %d entries after a failed write, want 2 (no temporary file)", len(entries))
	}
}

func TestReadCheckpointMissingFile(t *testing.T) {
	_, err := health.ReadCheckpoint(filepath.Join(t.TempDir(), "nope.json"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err %v, want fs.ErrNotExist", err)
	}
	if errors.Is(err, health.ErrCorruptCheckpoint) {
		t.Fatal("a missing checkpoint is not a corrupt one")
	}
}

func restoreInto(t *testing.T, p *health.Policy, cp health.Checkpoint, bootID string, devices ...health.Device) (*harness, []health.Transition) {
	t.Helper()
	h := newHarness(t, p, devices...)
	out, err := h.tr.Restore(cp, bootID, at(time.Hour), nil)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	return h, out
}

func allDevices() []health.Device {
	return []health.Device{gpuDevice(0), gpuDevice(1), gpuDevice(2), migDevice(2, 1, 0), migDevice(2, 2, 0)}
}

func TestRestoreSameBootBringsBackEverythingSticky(t *testing.T) {
	cp := faultyTracker(t, health.DefaultPolicy()).tr.Checkpoint()
	h, out := restoreInto(t, health.DefaultPolicy(), cp, "boot-1", allDevices()...)
	g0, g1, mig := gpuDevice(0).UUID, gpuDevice(1).UUID, migDevice(2, 2, 0).UUID
	h.wantHealth(g0, health.Unhealthy, false)
	h.wantHealth(g1, health.Unhealthy, true)
	h.wantHealth(mig, health.Unhealthy, false)
	h.wantHealth(gpuDevice(2).UUID, health.Healthy, false)
	h.wantHealth(migDevice(2, 1, 0).UUID, health.Healthy, false)
	if c := h.mustCondition(g0, health.ConditionXID, 48); !c.Since.Equal(at(time.Second)) {
		t.Fatalf("restored condition lost its Since: %+v", c)
	}
	h.mustCondition(g0, health.ConditionXID, 92)
	if _, ok := h.condition(g0, health.ConditionThermal, 0); ok {
		t.Fatal("a polled condition came back from the checkpoint")
	}
	if len(out) != 3 {
		t.Fatalf("transitions %+v, want one per device that came back unhealthy", out)
	}
	if s := h.tr.Snapshot(); s.BootID != "boot-1" {
		t.Fatalf("boot ID %q", s.BootID)
	}
	// The restored conditions behave as before: the quiet period (counted from when XID 92 was
	// last seen, before the restart) and the reset still end them.
	h.tick(time.Hour)
	if _, ok := h.condition(g0, health.ConditionXID, 92); ok {
		t.Fatal("restored XID 92 outlived its quiet period")
	}
	h.wantHealth(g0, health.Unhealthy, false)
	h.reset(g0, 2*time.Hour)
	h.wantHealth(g0, health.Healthy, false)
}

func TestRestoreAfterRebootKeepsOnlyAdminConditions(t *testing.T) {
	cp := faultyTracker(t, health.DefaultPolicy()).tr.Checkpoint()
	h, out := restoreInto(t, health.DefaultPolicy(), cp, "boot-2", allDevices()...)
	if len(out) != 0 {
		t.Fatalf("transitions %+v", out)
	}
	for _, d := range h.tr.Snapshot().Devices {
		if d.Health != health.Healthy || len(d.Conditions) != 0 {
			t.Errorf("%s after reboot: %+v", d.Device.UUID, d.Conditions)
		}
	}

	// Device-plugin conditions clear only by hand, so they survive the reboot.
	hp := newHarness(t, health.DevicePluginPolicy(), gpuDevice(0), gpuDevice(1))
	hp.tr.SetBootID("boot-1")
	hp.xid(gpuDevice(0).UUID, 79, 0)
	hp.xid(gpuDevice(1).UUID, 13, 0) // ignored: nothing to checkpoint
	h2, out := restoreInto(t, health.DevicePluginPolicy(), hp.tr.Checkpoint(), "boot-2", gpuDevice(0), gpuDevice(1))
	h2.wantHealth(gpuDevice(0).UUID, health.Unhealthy, false)
	h2.wantHealth(gpuDevice(1).UUID, health.Healthy, false)
	wantTransitions(t, out, tr(gpuDevice(0).UUID, health.Healthy, health.Unhealthy, "XID79"))
}

func TestRestoreKeepsADeviceMissingFromTheInventory(t *testing.T) {
	cp := faultyTracker(t, health.DefaultPolicy()).tr.Checkpoint()
	// GPU 1 and GPU 2 (with its MIG instances) are gone after the restart.
	h, _ := restoreInto(t, health.DefaultPolicy(), cp, "boot-1", gpuDevice(0))
	var got []string
	for _, d := range h.tr.Snapshot().Devices {
		got = append(got, fmt.Sprintf("%s:%v", d.Device.UUID, d.Health))
	}
	if !strings.Contains(strings.Join(got, " "), gpuDevice(1).UUID+":Unhealthy") {
		t.Fatalf("GPU 1 was forgotten: %q", got)
	}
	if !strings.Contains(strings.Join(got, " "), migDevice(2, 2, 0).UUID+":Unhealthy") {
		t.Fatalf("the MIG instance whose GPU vanished was forgotten: %q", got)
	}
	h.wantHealth(gpuDevice(1).UUID, health.Unhealthy, true)
	// The vanished GPU of the MIG instance comes back as a bare entry, and still owns the
	// instance: a reset of the GPU ends the instance's reset-class fault.
	h.wantHealth(gpuDevice(2).UUID, health.Healthy, false)
	h.reset(gpuDevice(2).UUID, 2*time.Hour)
	h.wantHealth(migDevice(2, 2, 0).UUID, health.Healthy, false)
	// After a reboot, a vanished device without admin conditions is not resurrected.
	h2, _ := restoreInto(t, health.DefaultPolicy(), cp, "boot-2", gpuDevice(0))
	if n := len(h2.tr.Snapshot().Devices); n != 1 {
		t.Fatalf("%d devices after a reboot, want 1", n)
	}
}

func TestRestoreDoesNotWeakenCurrentConditions(t *testing.T) {
	prev := newHarness(t, health.DefaultPolicy())
	prev.tr.SetBootID("b")
	uuid := gpuDevice(0).UUID
	p := health.DefaultPolicy()
	p.XIDs[48] = health.XIDRule{Severity: health.Degraded, ClearsOn: health.ClearsOnGPUReset}
	prevWeak := newHarness(t, p)
	prevWeak.tr.SetBootID("b")
	prevWeak.xid(uuid, 48, 0)
	h := newHarness(t, health.DefaultPolicy())
	h.xid(uuid, 48, time.Minute)
	if _, err := h.tr.Restore(prevWeak.tr.Checkpoint(), "b", at(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	h.wantHealth(uuid, health.Unhealthy, false)
}

func TestRestoreRejectsBadCheckpointsWithoutChangingTheTracker(t *testing.T) {
	nestedMIG := migDevice(9, 1, 0)
	nestedMIG.MIG.ParentUUID = migDevice(0, 1, 0).UUID
	cases := []struct {
		name string
		cp   health.Checkpoint
	}{
		{"condition without type", health.Checkpoint{BootID: "b", Devices: []health.CheckpointedDevice{
			{Device: gpuDevice(0), Conditions: []health.Condition{{Severity: health.Unhealthy, ClearsOn: health.ClearsOnAdmin}}},
		}}},
		{"condition without type on a vanished device", health.Checkpoint{BootID: "b", Devices: []health.CheckpointedDevice{
			{Device: gpuDevice(0), Conditions: []health.Condition{{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy}}},
			{Device: gpuDevice(5), Conditions: []health.Condition{{Severity: health.Unhealthy}}},
		}}},
		{"device without UUID", health.Checkpoint{BootID: "b", Devices: []health.CheckpointedDevice{
			{Device: gpuDevice(0), Conditions: []health.Condition{{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy}}},
			{Device: health.Device{Index: 4}, Conditions: []health.Condition{{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy}}},
		}}},
		{"MIG instance of a MIG instance", health.Checkpoint{BootID: "b", Devices: []health.CheckpointedDevice{
			{Device: nestedMIG, Conditions: []health.Condition{{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy}}},
		}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, health.DefaultPolicy(), gpuDevice(0), migDevice(0, 1, 0))
			h.tr.SetBootID("b")
			before := h.tr.Snapshot()
			gen := h.tr.Generation()
			out, err := h.tr.Restore(tc.cp, "b", at(0), nil)
			wantCorrupt(t, err)
			if len(out) != 0 || h.tr.Generation() != gen || !reflect.DeepEqual(h.tr.Snapshot(), before) {
				t.Fatalf("a rejected checkpoint changed the tracker: %+v", h.tr.Snapshot())
			}
			// The tracker still works.
			h.xid(migDevice(0, 1, 0).UUID, 48, time.Second)
			h.reset(gpuDevice(0).UUID, 2*time.Second)
			h.wantHealth(migDevice(0, 1, 0).UUID, health.Healthy, false)
		})
	}
}

func validCheckpointBytes(t testing.TB) []byte {
	t.Helper()
	cp := health.Checkpoint{BootID: "8c7c9b0e-boot", Time: at(time.Minute), Devices: []health.CheckpointedDevice{
		{Device: gpuDevice(0), Conditions: []health.Condition{{
			Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, Reason: "XID79", Message: "XID 79: fallen off the bus",
			Since: at(time.Second), LastSeen: at(2 * time.Second), ClearsOn: health.ClearsOnNodeReboot, RecommendedAction: health.ActionRebootNode, Evict: true,
		}}},
		{Device: migDevice(0, 1, 0), Conditions: []health.Condition{{
			Type: health.ConditionXID, Code: 92, Severity: health.Degraded, Reason: "XID92", Since: at(0), LastSeen: at(0), ClearsOn: health.ClearsOnQuietPeriod,
		}}},
	}}
	b, err := health.MarshalCheckpoint(cp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// envelope re-encodes a checkpoint file around data with the right checksum, so that tests can
// reach the checks behind the checksum.
func envelope(t *testing.T, version int, data string) []byte {
	t.Helper()
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(data)); err != nil {
		t.Fatal(err)
	}
	b, err := health.MarshalCheckpoint(health.Checkpoint{})
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	f["version"] = version
	f["data"] = json.RawMessage(compact.Bytes())
	f["checksum"] = "sha256:" + sha256Hex(compact.Bytes())
	out, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestUnmarshalCheckpointRejectsCorruptFiles(t *testing.T) {
	valid := validCheckpointBytes(t)
	if _, err := health.UnmarshalCheckpoint(valid); err != nil {
		t.Fatalf("valid checkpoint: %v", err)
	}
	cases := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"whitespace", []byte("  \n")},
		{"not JSON", []byte("checkpoint")},
		{"JSON null", []byte("null")},
		{"a JSON list", []byte("[1,2]")},
		{"empty object", []byte("{}")},
		{"truncated", valid[:len(valid)/2]},
		{"trailing garbage", append(append([]byte{}, valid...), "}"...)},
		{"version 0", envelope(t, 0, `{"bootID":"b","time":"2026-01-01T00:00:00Z","devices":null}`)},
		{"negative version", envelope(t, -1, `{"bootID":"b","time":"2026-01-01T00:00:00Z","devices":null}`)},
		{"no data", []byte(`{"version":1,"checksum":"sha256:` + sha256Hex(nil) + `"}`)},
		{"checksum missing", bytes.Replace(valid, []byte(`"sha256:`), []byte(`"`), 1)},
		{"checksum of other data", bytes.Replace(valid, []byte(`8c7c9b0e-boot`), []byte(`8c7c9b0f-boot`), 1)},
		{"data not an object", envelope(t, health.CheckpointVersion, `[]`)},
		// The frame every version shares: what a newer release adds is read (see
		// checkpoint_compat_test.go); a frame of another shape is damage.
		{"bad time", envelope(t, health.CheckpointVersion, `{"bootID":"b","time":"yesterday"}`)},
		{"boot ID not a string", envelope(t, health.CheckpointVersion, `{"bootID":7}`)},
		{"devices not a list", envelope(t, health.CheckpointVersion, `{"bootID":"b","devices":{"GPU-1":{}}}`)},
		{"cursors not an object", envelope(t, health.CheckpointVersion+1, `{"bootID":"b","cursors":[{"bootID":"b","seq":1}]}`)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := health.UnmarshalCheckpoint(tc.b)
			wantCorrupt(t, err)
			path := filepath.Join(t.TempDir(), "cp.json")
			if err := os.WriteFile(path, tc.b, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err = health.ReadCheckpoint(path)
			wantCorrupt(t, err)
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("ReadCheckpoint error %q does not name the file", err)
			}
		})
	}
}

func wantCorrupt(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, health.ErrCorruptCheckpoint) {
		t.Fatalf("err %v, want ErrCorruptCheckpoint", err)
	}
	if msg := err.Error(); msg == "" || strings.Contains(msg, "\n") {
		t.Fatalf("error %q is not one line", msg)
	}
}

func TestUnmarshalCheckpointEveryTruncation(t *testing.T) {
	valid := validCheckpointBytes(t)
	for n := range len(valid) {
		if _, err := health.UnmarshalCheckpoint(valid[:n]); !errors.Is(err, health.ErrCorruptCheckpoint) {
			t.Fatalf("truncated to %d bytes: err %v, want ErrCorruptCheckpoint", n, err)
		}
	}
}

func TestUnmarshalCheckpointEveryBitFlip(t *testing.T) {
	valid := validCheckpointBytes(t)
	want, err := health.UnmarshalCheckpoint(valid)
	if err != nil {
		t.Fatal(err)
	}
	// The envelope ends with the checksummed data.
	dataStart := bytes.Index(valid, []byte(`"data":`)) + len(`"data":`)
	if dataStart < len(`"data":`) {
		t.Fatal("no data field")
	}
	for i := range valid {
		for bit := range 8 {
			b := bytes.Clone(valid)
			b[i] ^= 1 << bit
			got, err := health.UnmarshalCheckpoint(b)
			if err == nil {
				// A flip the format cannot see must at least be harmless (for example the case
				// of a letter in an envelope key, which encoding/json matches case-insensitively);
				// nothing inside the checksummed data may change unnoticed.
				if i >= dataStart || !reflect.DeepEqual(got, want) {
					t.Fatalf("flip of bit %d of byte %d (%q) went unnoticed and changed the checkpoint", bit, i, valid[i])
				}
				continue
			}
			if !errors.Is(err, health.ErrCorruptCheckpoint) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("flip of bit %d of byte %d: err %v", bit, i, err)
			}
		}
	}
}

func TestReadBootID(t *testing.T) {
	if _, err := os.Stat("/proc/sys/kernel/random/boot_id"); err != nil {
		t.Skip("no boot ID on this system")
	}
	a, err := health.ReadBootID()
	if err != nil || a == "" || strings.ContainsAny(a, " \n") {
		t.Fatalf("ReadBootID: %q, %v", a, err)
	}
	if b, _ := health.ReadBootID(); b != a {
		t.Fatalf("boot ID changed within one boot: %q then %q", a, b)
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
