package health_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// TestRequestsAppliedOutliveTheProcess: a request applied is remembered in the checkpoint and
// known as applied by the next process (the version 5 fixture carries two).
func TestRequestsAppliedOutliveTheProcess(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy(), allDevices()...)
	m := health.NewMonitor(h.tr)
	if m.RequestApplied("clear/a") {
		t.Fatal("a request never applied is known as applied")
	}
	m.RememberRequest("clear/a", at(0), at(time.Minute))
	if !m.RequestApplied("clear/a") {
		t.Fatal("RememberRequest did not remember")
	}
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := health.WriteCheckpoint(path, h.tr.Checkpoint()); err != nil {
		t.Fatal(err)
	}
	cp, err := health.ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	// After a reboot too: the requests are the Node's.
	next, _ := restoreInto(t, health.DefaultPolicy(), cp, "boot-2", allDevices()...)
	if !next.tr.RequestApplied("clear/a") || next.tr.RequestApplied("clear/b") {
		t.Errorf("restored requests: clear/a %v (want true), clear/b %v (want false)", next.tr.RequestApplied("clear/a"), next.tr.RequestApplied("clear/b"))
	}

	fixture := filepath.Join(t.TempDir(), "v5.json")
	if err := os.WriteFile(fixture, readFixture(t, "checkpoint-v5.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	cp, err = health.ReadCheckpoint(fixture)
	if err != nil {
		t.Fatal(err)
	}
	fromFixture, _ := restoreInto(t, health.DefaultPolicy(), cp, fixtureBoot, allDevices()...)
	for _, key := range []string{"clear/5f2b7c1e9a0d4b3c8e6f1a2b3c4d5e6f", "validation/0a1b2c3d4e5f60718293a4b5c6d7e8f9"} {
		if !fromFixture.tr.RequestApplied(key) {
			t.Errorf("the version 5 fixture's request %s is not known as applied", key)
		}
	}
}

// TestRequestMemoryIsBounded: requests written more than RequestMemory ago are forgotten, and
// at most a bounded number is kept, the oldest going first.
func TestRequestMemoryIsBounded(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy(), allDevices()...)
	m := health.NewMonitor(h.tr)
	now := at(health.RequestMemory + time.Hour)
	m.RememberRequest("clear/old", at(0), at(0))
	m.RememberRequest("clear/new", now, now)
	if m.RequestApplied("clear/old") {
		t.Error("a request written more than RequestMemory ago is still remembered")
	}
	for i := range 2000 {
		m.RememberRequest(fmt.Sprintf("clear/%04d", i), now.Add(time.Duration(i)*time.Second), now)
	}
	if n := len(h.tr.Checkpoint().Requests); n != 1024 {
		t.Errorf("remembered %d requests, want the bound 1024", n)
	}
	if m.RequestApplied("clear/0000") || !m.RequestApplied("clear/1999") {
		t.Error("the bound did not drop the oldest requests first")
	}
}
