package health_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

func TestAdvanceAppliesSignalsAndMovesTheCursorTogether(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy(), gpuDevice(0))
	if _, ok := h.tr.Cursor("kmsg"); ok {
		t.Fatal("a fresh tracker has a kmsg cursor")
	}
	sigs := []health.Signal{
		health.XIDSignal(gpuDevice(0).UUID, 79, at(time.Second)),
		health.XIDSignal("GPU-unknown", 79, at(time.Second)), // dropped, not an error
	}
	ts := h.tr.Advance("kmsg", health.Cursor{BootID: "b1", Seq: 42}, sigs, nil)
	if len(ts) != 1 || ts[0].To != health.Unhealthy {
		t.Fatalf("transitions = %+v, want GPU 0 to Unhealthy", ts)
	}
	if c, ok := h.tr.Cursor("kmsg"); !ok || c != (health.Cursor{BootID: "b1", Seq: 42}) {
		t.Fatalf("Cursor = %+v, %v; want b1/42", c, ok)
	}
	cp := h.tr.Checkpoint()
	if cp.Cursors["kmsg"] != (health.Cursor{BootID: "b1", Seq: 42}) || len(cp.Devices) != 1 {
		t.Fatalf("checkpoint = %+v, want the XID and the cursor", cp)
	}
}

func TestCheckpointCursorsRoundTripAndOldCheckpointsStillRead(t *testing.T) {
	// A checkpoint written before cursors existed: validCheckpointBytes has none.
	cp, err := health.UnmarshalCheckpoint(validCheckpointBytes(t))
	if err != nil {
		t.Fatalf("checkpoint without cursors: %v", err)
	}
	if cp.Cursors != nil {
		t.Fatalf("Cursors = %v, want none", cp.Cursors)
	}
	h, _ := restoreInto(t, health.DefaultPolicy(), cp, cp.BootID, allDevices()...)
	if _, ok := h.tr.Cursor("kmsg"); ok {
		t.Fatal("a cursor appeared from a checkpoint without one")
	}

	cp.Cursors = map[string]health.Cursor{"kmsg": {BootID: "b0", Seq: 7}}
	b, err := health.MarshalCheckpoint(cp)
	if err != nil {
		t.Fatal(err)
	}
	back, err := health.UnmarshalCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	if back.Cursors["kmsg"] != (health.Cursor{BootID: "b0", Seq: 7}) {
		t.Fatalf("round trip lost the cursor: %+v", back.Cursors)
	}
	// After a reboot the cursor still comes back: it names its own boot, and the source
	// decides it is stale.
	h, _ = restoreInto(t, health.DefaultPolicy(), back, "another-boot", allDevices()...)
	if c, ok := h.tr.Cursor("kmsg"); !ok || c.BootID != "b0" || c.Seq != 7 {
		t.Fatalf("restored cursor = %+v, %v", c, ok)
	}
}

// A record applied through Advance is saved together with its cursor; a restarted process
// that replays from the saved cursor skips it, so the XID is counted once across the restart.
func TestRuntimeSavesTheCursorAndARestartDoesNotApplyARecordTwice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	f := newRuntime(t, health.DefaultPolicy(), "boot-1", path)
	f.run(nil)
	uuid := gpuDevice(1).UUID
	// An application XID changes no sticky state: the cursor alone is worth a write, at the next
	// tick (a storm of such records costs one write a tick).
	f.rt.Monitor().Advance("kmsg", health.Cursor{BootID: "boot-1", Seq: 10}, health.XIDSignal(uuid, 13, t0))
	f.rt.Monitor().Advance("kmsg", health.Cursor{BootID: "boot-1", Seq: 11}, health.XIDSignal(uuid, 13, t0))
	healthtest.Eventually(t, "a checkpoint with cursor 11 after a tick", func() bool {
		f.step(health.DefaultTickInterval)
		cp, err := health.ReadCheckpoint(path)
		return err == nil && cp.Cursors["kmsg"].Seq == 11
	})
	// A sticky change is written at once, with its cursor.
	f.rt.Monitor().Advance("kmsg", health.Cursor{BootID: "boot-1", Seq: 12}, health.XIDSignal(uuid, 79, t0))
	healthtest.Eventually(t, "a checkpoint with XID 79 and cursor 12", func() bool {
		cp, err := health.ReadCheckpoint(path)
		return err == nil && cp.Cursors["kmsg"].Seq == 12 && len(cp.Devices) == 1
	})
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}

	g := newRuntime(t, health.DefaultPolicy(), "boot-1", path)
	if restored, err := g.rt.Restore(); err != nil || !restored {
		t.Fatalf("Restore = %v, %v", restored, err)
	}
	c, ok := g.rt.Monitor().Cursor("kmsg")
	if !ok || c != (health.Cursor{BootID: "boot-1", Seq: 12}) {
		t.Fatalf("restored cursor = %+v, %v; want boot-1/12", c, ok)
	}
	if got := g.health(1); got != health.Unhealthy {
		t.Fatalf("restored GPU 1 is %v, want Unhealthy", got)
	}
	// Nothing was written by the restore itself.
	if st2, err := os.Stat(path); err != nil || !st2.ModTime().Equal(st.ModTime()) {
		t.Fatalf("restore rewrote the checkpoint (%v)", err)
	}
}
