package health_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The golden checkpoints in testdata hold one scenario, on GPUs 0..2 with GPU 2's MIG instances
// (allDevices), in boot "boot-1": XID 48 (gpuReset) and XID 92 (quietPeriod) on GPU 0, XID 79
// (nodeReboot, evict) and an administrative drain on GPU 1, XID 62 on MIG instance 2/0 of GPU 2,
// and a temperature reading, which is not sticky and so is in none of them.
//
//   - checkpoint-v1-nocursors.json: version 1 as the releases before per-source cursors wrote it,
//     written by running the encoder of commit 84cb788 (the last one without cursors) on the
//     scenario; the first releases wrote the same shape.
//   - checkpoint-v1.json: version 1 as this release writes it: the same faults and the kernel
//     log's cursor. TestCheckpointFixtureOfThisVersionIsWhatTheEncoderWrites holds the encoder
//     to it, so a change of the format needs a new version and a new fixture.
//   - checkpoint-v2.json: version 2, which adds each GPU's history (faults and repairs): the
//     same faults, the cursor, GPU 0's XID 48 that came back after a reset, and a placeholder
//     for a missing GPU with the XID 79 a kernel-log line named (restored only into a tracker
//     whose inventory has the placeholder: a GPU that is back is not held missing).
//   - checkpoint-v3.json: version 3, which marks the XID conditions the driver said an earlier
//     XID caused (causedByPrevious): the same as version 2, and GPU 1's XID 145 caused by
//     another's (sticky, restored; never taken for a root cause).
//   - checkpoint-v6.json: version 6, which adds each GPU's board serial (device.serial): the
//     same as version 5, with the serials of GPUs 0 and 1. The serial is an attribute, as the
//     model is: a device is matched by UUID, and a GPU the inventory has keeps the backend's.
//   - checkpoint-v7.json: version 7, which adds each GPU's VBIOS version (device.vbios): the same
//     as version 6, with the VBIOS versions of GPUs 0 and 1; an attribute as the serial is.
//   - checkpoint-next.json: a checkpoint of a newer release, made by hand from checkpoint-v1.json:
//     version 8 (it said 2 until version 2 was made, 3 until version 3, and so on; until version 6
//     its device.serial was a field this release did not know, boardPartNumber is now), fields
//     this release does not know at every level, a condition type it does not
//     raise (kept), a severity and a clearsOn it does not have (skipped), a vanished GPU, a new
//     cursor and a cursor of another shape (skipped).
//
// Once a release has written a fixture's version, the fixture never changes: it is what the
// nodes that run that release have on disk.

const fixtureBoot = "boot-1"

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no fixture testdata/%s: a new checkpoint format version needs one, written by its encoder with every field set", name)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// faultList lists the conditions of every device in the tracker, sorted, one line each.
func faultList(tr *health.Tracker) []string {
	var out []string
	for _, d := range tr.Snapshot().Devices {
		for _, c := range d.Conditions {
			out = append(out, fmt.Sprintf("%s %s/%d %v %v evict=%v since=%s",
				d.Device.UUID, c.Type, c.Code, c.Severity, c.ClearsOn, c.Evict, c.Since.UTC().Format(time.TimeOnly)))
		}
	}
	slices.Sort(out)
	return out
}

// v1Faults is what the version 1 fixtures restore in their own boot.
func v1Faults() []string {
	return []string{
		"GPU-0000 XID/48 Unhealthy gpuReset evict=false since=03:04:06",
		"GPU-0000 XID/92 Degraded quietPeriod evict=false since=03:04:07",
		"GPU-0001 Admin/0 Unhealthy admin evict=false since=03:04:11",
		"GPU-0001 XID/79 Unhealthy nodeReboot evict=true since=03:04:09",
		"MIG-0002-2-0 XID/62 Unhealthy gpuReset evict=false since=03:04:10",
	}
}

// adminFaults is what every fixture restores after a reboot.
func adminFaults() []string {
	return []string{"GPU-0001 Admin/0 Unhealthy admin evict=false since=03:04:11"}
}

func with(base []string, more ...string) []string {
	out := append(slices.Clone(base), more...)
	slices.Sort(out)
	return out
}

func without(t *testing.T, base []string, prefix string) []string {
	t.Helper()
	out := slices.DeleteFunc(slices.Clone(base), func(s string) bool { return strings.HasPrefix(s, prefix) })
	if len(out) != len(base)-1 {
		t.Fatalf("no single fault %q in %q", prefix, base)
	}
	return out
}

// cursorList lists the tracker's cursors of the sources the fixtures name.
func cursorList(tr *health.Tracker) map[string]health.Cursor {
	out := map[string]health.Cursor{}
	for _, name := range []string{"kmsg", "journal", "nvmlEvents"} {
		if c, ok := tr.Cursor(name); ok {
			out[name] = c
		}
	}
	return out
}

// restoreFixture decodes b and restores it into a tracker of allDevices in bootID.
func restoreFixture(t *testing.T, b []byte, bootID string) *harness {
	t.Helper()
	cp, err := health.UnmarshalCheckpoint(b)
	if err != nil {
		t.Fatalf("UnmarshalCheckpoint: %v", err)
	}
	h, _ := restoreInto(t, health.DefaultPolicy(), cp, bootID, allDevices()...)
	return h
}

func TestCheckpointFixturesRestore(t *testing.T) {
	kmsg := health.Cursor{BootID: fixtureBoot, Seq: 1234}
	cases := []struct {
		file    string
		faults  []string
		cursors map[string]health.Cursor
	}{
		{"checkpoint-v1-nocursors.json", v1Faults(), map[string]health.Cursor{}},
		{"checkpoint-v1.json", v1Faults(), map[string]health.Cursor{"kmsg": kmsg}},
		{"checkpoint-v2.json", v1Faults(), map[string]health.Cursor{"kmsg": kmsg}},
		{"checkpoint-v3.json", currentFaults(), map[string]health.Cursor{"kmsg": kmsg}},
		{"checkpoint-v5.json", currentFaults(), map[string]health.Cursor{"kmsg": kmsg}},
		{"checkpoint-v6.json", currentFaults(), map[string]health.Cursor{"kmsg": kmsg}},
		{"checkpoint-v7.json", currentFaults(), map[string]health.Cursor{"kmsg": kmsg}},
		{"checkpoint-next.json", with(v1Faults(),
			"GPU-0000 C2CLinkDown/1 Unhealthy gpuReset evict=true since=03:04:13",      // a type this release does not raise
			"GPU-0003 FabricDegraded/0 Degraded nodeReboot evict=false since=03:04:16", // on a GPU that vanished
		), map[string]health.Cursor{"kmsg": kmsg, "journal": {BootID: fixtureBoot, Seq: 77}}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			b := readFixture(t, tc.file)
			path := filepath.Join(t.TempDir(), "checkpoint.json")
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			cp, err := health.ReadCheckpoint(path)
			if err != nil {
				t.Fatalf("ReadCheckpoint: %v", err)
			}
			h, _ := restoreInto(t, health.DefaultPolicy(), cp, fixtureBoot, allDevices()...)
			if got := faultList(h.tr); !slices.Equal(got, tc.faults) {
				t.Errorf("restored faults\n got %q\nwant %q", got, tc.faults)
			}
			if got := cursorList(h.tr); !maps.Equal(got, tc.cursors) {
				t.Errorf("restored cursors %v, want %v", got, tc.cursors)
			}
			// The restored faults behave as this release's own: a reset of GPU 0 ends its reset
			// faults, and what lasts until the quiet period stays.
			h.reset(gpuDevice(0).UUID, 2*time.Hour)
			for _, f := range faultList(h.tr) {
				if strings.HasPrefix(f, "GPU-0000") && strings.Contains(f, " gpuReset ") {
					t.Errorf("a reset of GPU 0 left %q", f)
				}
			}

			after := restoreFixture(t, b, "boot-2")
			if got := faultList(after.tr); !slices.Equal(got, adminFaults()) {
				t.Errorf("after a reboot\n got %q\nwant %q", got, adminFaults())
			}
		})
	}
}

// TestCheckpointFixtureOfThisVersionIsWhatTheEncoderWrites holds the encoder to the fixture of
// CheckpointVersion: the fixture decodes and encodes back to itself byte for byte, and it has
// every field the format has, so that neither a changed encoding nor a new field goes unnoticed.
func TestCheckpointFixtureOfThisVersionIsWhatTheEncoderWrites(t *testing.T) {
	name := fmt.Sprintf("checkpoint-v%d.json", health.CheckpointVersion)
	b := readFixture(t, name)
	cp, err := health.UnmarshalCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := health.MarshalCheckpoint(cp)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(append(enc, '\n'), b) {
		t.Errorf("the encoder no longer writes testdata/%s: the checkpoint format changed. Keep the fixture as it is "+
			"(nodes have it on disk), raise CheckpointVersion and add the new version's fixture. It writes\n%s", name, enc)
	}

	var file struct {
		Data any `json:"data"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeFor[health.Checkpoint]()
	want, got := map[string]bool{}, map[string]bool{}
	typeFieldPaths(typ, "", want)
	valueFieldPaths(file.Data, typ, "", got)
	var missing, extra []string
	for p := range want {
		if !got[p] {
			missing = append(missing, p)
		}
	}
	for p := range got {
		if !want[p] {
			extra = append(extra, p)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("testdata/%s lacks fields %q and has fields %q that the format does not: the checkpoint format changed. "+
			"Keep the fixture as it is, raise CheckpointVersion and add the new version's fixture, every field set", name, missing, extra)
	}
}

func isJSONValue(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return pt.Implements(reflect.TypeFor[json.Unmarshaler]()) || pt.Implements(reflect.TypeFor[interface{ UnmarshalText([]byte) error }]())
}

// typeFieldPaths adds the path of every field a value of type t can encode
// ("devices[].device.mig.parentUUID", "cursors.*.seq").
func typeFieldPaths(t reflect.Type, path string, out map[string]bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if isJSONValue(t) {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			p := strings.TrimPrefix(path+"."+name, ".")
			out[p] = true
			typeFieldPaths(f.Type, p, out)
		}
	case reflect.Slice:
		typeFieldPaths(t.Elem(), path+"[]", out)
	case reflect.Map:
		typeFieldPaths(t.Elem(), path+".*", out)
	}
}

// valueFieldPaths adds the path of every field present in v, a decoded JSON value of type t.
func valueFieldPaths(v any, t reflect.Type, path string, out map[string]bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if isJSONValue(t) {
		return
	}
	switch v := v.(type) {
	case map[string]any:
		if t.Kind() == reflect.Map {
			for _, e := range v {
				valueFieldPaths(e, t.Elem(), path+".*", out)
			}
			return
		}
		for key, e := range v {
			p := strings.TrimPrefix(path+"."+key, ".")
			out[p] = true
			if f, ok := fieldByJSONName(t, key); ok {
				valueFieldPaths(e, f.Type, p, out)
			}
		}
	case []any:
		for _, e := range v {
			valueFieldPaths(e, t.Elem(), path+"[]", out)
		}
	}
}

func fieldByJSONName(t reflect.Type, name string) (reflect.StructField, bool) {
	if t.Kind() != reflect.Struct {
		return reflect.StructField{}, false
	}
	for f := range t.Fields() {
		if n, _, _ := strings.Cut(f.Tag.Get("json"), ","); n == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// compatCase changes this release's fixture as a newer release might, and says what must still
// be restored and what the decoder's notes must say.
type compatCase struct {
	name    string
	change  func(env, data map[string]any)
	faults  []string
	cursors map[string]health.Cursor
	// version, unknown and skipped are what CheckpointNotes must say; version 0 means
	// CheckpointVersion.
	version int
	unknown []string
	skipped int
}

func obj(v any, path ...any) map[string]any {
	for _, p := range path {
		switch p := p.(type) {
		case string:
			v = v.(map[string]any)[p]
		case int:
			v = v.([]any)[p]
		}
	}
	return v.(map[string]any)
}

// currentFaults are the faults of this release's fixture (checkpoint-v<CheckpointVersion>.json).
func currentFaults() []string {
	return with(v1Faults(), "GPU-0001 XID/145 Unhealthy gpuReset evict=true since=03:04:10")
}

func compatCases(t *testing.T) []compatCase {
	kmsg := map[string]health.Cursor{"kmsg": {BootID: fixtureBoot, Seq: 1234}}
	return []compatCase{
		{name: "a newer version", version: health.CheckpointVersion + 1,
			change: func(env, _ map[string]any) { env["version"] = health.CheckpointVersion + 1 },
			faults: currentFaults(), cursors: kmsg},
		{name: "a field in the envelope", unknown: []string{"writer"},
			change: func(env, _ map[string]any) { env["writer"] = "gpuhealth v9" },
			faults: currentFaults(), cursors: kmsg},
		{name: "a field in the data", unknown: []string{"data.nodeName"},
			change: func(_, data map[string]any) { data["nodeName"] = "node-a" },
			faults: currentFaults(), cursors: kmsg},
		{name: "a field in a device's identity", unknown: []string{"data.devices[].device.boardPartNumber"},
			change: func(_, data map[string]any) {
				obj(data, "devices", 0, "device")["boardPartNumber"] = "692-2G520-0200-000"
			},
			faults: currentFaults(), cursors: kmsg},
		{name: "a field in a MIG placement", unknown: []string{"data.devices[].device.mig.profile"},
			change: func(_, data map[string]any) { obj(data, "devices", 2, "device", "mig")["profile"] = "1g.10gb" },
			faults: currentFaults(), cursors: kmsg},
		{name: "a field beside a device's conditions", unknown: []string{"data.devices[].xids"},
			change: func(_, data map[string]any) {
				obj(data, "devices", 0)["xids"] = []any{map[string]any{"xid": 13, "count": 2}}
			},
			faults: currentFaults(), cursors: kmsg},
		{name: "a field in a condition", unknown: []string{"data.devices[].conditions[].count"},
			change: func(_, data map[string]any) { obj(data, "devices", 0, "conditions", 0)["count"] = 3 },
			faults: currentFaults(), cursors: kmsg},
		{name: "a field in a cursor", unknown: []string{"data.cursors.*.offset"},
			change: func(_, data map[string]any) { obj(data, "cursors", "kmsg")["offset"] = 991 },
			faults: currentFaults(), cursors: kmsg},
		{name: "a condition type this release does not raise",
			change: func(_, data map[string]any) {
				d := obj(data, "devices", 0)
				d["conditions"] = append(d["conditions"].([]any), map[string]any{
					"type": "C2CLinkDown", "code": 1, "severity": "Unhealthy", "reason": "C2CLinkDown", "message": "C2C link 1 is down",
					"since": "2026-01-02T03:04:13Z", "lastSeen": "2026-01-02T03:04:13Z", "clearsOn": "gpuReset", "recommendedAction": "resetGPU",
				})
			},
			faults: with(currentFaults(), "GPU-0000 C2CLinkDown/1 Unhealthy gpuReset evict=false since=03:04:13"), cursors: kmsg},
		{name: "a severity this release does not have", skipped: 1,
			change: func(_, data map[string]any) { obj(data, "devices", 0, "conditions", 1)["severity"] = "Critical" },
			faults: without(t, currentFaults(), "GPU-0000 XID/92"), cursors: kmsg},
		{name: "a clearsOn this release does not have", skipped: 1,
			change: func(_, data map[string]any) { obj(data, "devices", 1, "conditions", 0)["clearsOn"] = "driverReload" },
			faults: without(t, currentFaults(), "GPU-0001 XID/79"), cursors: kmsg},
		{name: "a cursor of another shape", skipped: 1,
			change: func(_, data map[string]any) {
				obj(data, "cursors")["nvmlEvents"] = map[string]any{"bootID": fixtureBoot, "seq": "token-9"}
			},
			faults: currentFaults(), cursors: kmsg},
		{name: "a device identity of another shape", skipped: 1,
			change: func(_, data map[string]any) { obj(data, "devices", 2, "device")["index"] = "two" },
			faults: without(t, currentFaults(), "MIG-0002-2-0 XID/62"), cursors: kmsg},
	}
}

// changedFixture applies change to this release's fixture and checksums the result.
func changedFixture(t *testing.T, change func(env, data map[string]any)) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(readFixture(t, fmt.Sprintf("checkpoint-v%d.json", health.CheckpointVersion))))
	dec.UseNumber()
	var env map[string]any
	if err := dec.Decode(&env); err != nil {
		t.Fatal(err)
	}
	data := env["data"].(map[string]any)
	change(env, data)
	raw, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	env["data"] = json.RawMessage(raw)
	env["checksum"] = "sha256:" + sha256Hex(raw)
	b, err := json.MarshalIndent(env, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUnmarshalCheckpointReadsNewerReleases: whatever a newer release adds, every fault this
// release can represent comes back, so that a rollback loses none of them.
func TestUnmarshalCheckpointReadsNewerReleases(t *testing.T) {
	for _, tc := range compatCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			h := restoreFixture(t, changedFixture(t, tc.change), fixtureBoot)
			if got := faultList(h.tr); !slices.Equal(got, tc.faults) {
				t.Errorf("restored faults\n got %q\nwant %q", got, tc.faults)
			}
			if got := cursorList(h.tr); !maps.Equal(got, tc.cursors) {
				t.Errorf("restored cursors %v, want %v", got, tc.cursors)
			}
		})
	}
}
