package kmsg

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// A process that writes NVRM lines to the real /dev/kmsg, whatever priority prefix it gives
// them (the kernel refuses facility 0 from userspace), changes no GPU's health: the lines are
// counted as spoofed. Root can write /dev/kmsg; the test skips only where it cannot read or
// write it.
func TestSourceIgnoresNVRMLinesWrittenByAProcess(t *testing.T) {
	sink := &fakeSink{}
	src := newSource(openKmsg(t, SeekEnd()), inventory(), SourceOptions{BootID: "b1"})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()

	nonce := time.Now().UnixNano()
	lines := []string{
		fmt.Sprintf("NVRM: Xid (PCI:0000:3b:00): 79, pid=%d, name=spoof, GPU has fallen off the bus.", nonce%100000),
		// "<3>" asks for kernel facility, level err: the kernel turns facility 0 into user.
		"<3>NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
		"<0>NVRM: GPU 0000:86:00.0: RmInitAdapter failed! (0x24:0x72:1568)",
		"<11>NVRM: Xid (PCI:0000:86:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
	}
	for _, l := range lines {
		w, err := os.OpenFile(DevKmsg, os.O_WRONLY, 0)
		if err != nil {
			t.Skipf("cannot write %s: %v", DevKmsg, err)
		}
		// One write is one record.
		_, err = w.WriteString(l + "\n")
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Skipf("cannot write %s: %v", DevKmsg, err)
		}
	}
	deadline := time.Now().Add(safetyNet)
	for src.Stats().Spoofed < uint64(len(lines)) {
		if time.Now().After(deadline) {
			t.Fatalf("stats = %+v, want %d spoofed lines", src.Stats(), len(lines))
		}
		time.Sleep(time.Millisecond)
	}
	if got := sink.signals(); len(got) != 0 {
		t.Errorf("spoofed lines produced signals: %+v", got)
	}
	t.Logf("stats after the spoofed lines: %+v", src.Stats())
}

// A record read as soon as it is logged gets a wall time within a second of the time it was
// written: the clock bootClock reads keeps to the one the kernel stamps records with, far inside
// the de-duplication window. Skips where /dev/kmsg cannot be read and written.
func TestWallTimeOfAFreshRecordOnTheRealDevice(t *testing.T) {
	r := openKmsg(t, SeekEnd())
	w, err := os.OpenFile(DevKmsg, os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("cannot write %s: %v", DevKmsg, err)
	}
	marker := fmt.Sprintf("gpuhealth kmsg clock test %d", time.Now().UnixNano())
	written := time.Now()
	_, err = w.WriteString(marker + "\n")
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Skipf("cannot write %s: %v", DevKmsg, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), safetyNet)
	defer cancel()
	rec := nextWith(ctx, t, r, marker)
	// The estimate before wallTime clamps it to the moment of reading, which would hide a clock
	// running ahead.
	now, up := bootClock()
	at := now.Add(rec.Since - up)
	// The record was logged between written and now; the slack is for the two clocks.
	if slack := time.Second; at.Before(written.Add(-slack)) || at.After(now.Add(slack)) {
		t.Errorf("record logged at about %v placed at %v (%v off)", written, at, at.Sub(written))
	}
	t.Logf("placed %v after the write", at.Sub(written))
}
