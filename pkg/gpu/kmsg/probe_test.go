package kmsg

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProbeReportsTheDriversEventsAndIgnoresProcesses(t *testing.T) {
	r := newReader(newFakeSource(
		fakeRead{data: "6,1,1000,-;Linux version 6.18\n"},
		fakeRead{data: "4,2,2000000,-;NVRM: GPU at PCI:0000:3b:00: GPU-11111111-2222-3333-4444-555555555555\n"},
		fakeRead{data: "4,3,2000100,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"},
		// A process's NVRM line (facility user): counted, never an event.
		fakeRead{data: "11,4,3000000,-;NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error\n"},
		fakeRead{data: "not a record\n"},
		fakeRead{data: "3,5,4000000,-;NVRM: GPU 0000:86:00.0: RmInitAdapter failed! (0x24:0x72:1568)\n"},
	))
	rep, err := probe(t.Context(), "fake", r)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Readable || rep.Error != "" {
		t.Fatalf("report %+v, want readable", rep)
	}
	if rep.Records != 5 || rep.KernelRecords != 4 || rep.Spoofed != 1 || rep.Malformed != 1 {
		t.Errorf("records %d, kernel %d, spoofed %d, malformed %d; want 5, 4, 1, 1", rep.Records, rep.KernelRecords, rep.Spoofed, rep.Malformed)
	}
	var got []string
	for _, e := range rep.Events {
		got = append(got, fmt.Sprintf("%s %s %d %s", e.Kind, e.PCIBusID, e.Xid, e.UUID))
	}
	want := []string{
		"Identity 0000:3b:00.0 0 GPU-11111111-2222-3333-4444-555555555555",
		"Xid 0000:3b:00.0 79 ",
		"InitFailed 0000:86:00.0 0 ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if rep.Events[1].Since != 2000100*time.Microsecond {
		t.Errorf("XID at %v since boot, want 2.0001s", rep.Events[1].Since)
	}
}

func TestProbeSaysWhyTheLogCannotBeRead(t *testing.T) {
	rep, err := Probe(t.Context(), filepath.Join(t.TempDir(), "no-kmsg"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Readable || !strings.Contains(rep.Error, "no such file") || !strings.Contains(rep.Hint, "mount the host's /dev/kmsg") {
		t.Errorf("report %+v, want unreadable with the missing mount as hint", rep)
	}
	// The two causes of EPERM: dmesg_restrict without CAP_SYSLOG, and a container's device rules.
	hint := Hint(&os.PathError{Op: "open", Path: DevKmsg, Err: syscall.EPERM})
	for _, want := range []string{"CAP_SYSLOG", "kernel.dmesg_restrict", "char 1:11", "privileged kmsg-relay container"} {
		if !strings.Contains(hint, want) {
			t.Errorf("EPERM hint %q lacks %q", hint, want)
		}
	}
	// A read error after a good open is reported too.
	rep, err = probe(t.Context(), "fake", newReader(newFakeSource(fakeRead{data: "6,1,1,-;ok\n"}, fakeRead{err: syscall.EIO})))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Readable || rep.Records != 1 || !strings.Contains(rep.Error, "input/output error") {
		t.Errorf("report %+v, want unreadable after one record with EIO", rep)
	}
}

// On this machine's real /dev/kmsg: the probe reads the whole buffer, and a line a process just
// wrote is in it as spoofed.
func TestProbeReadsTheRealKernelLog(t *testing.T) {
	w, err := os.OpenFile(DevKmsg, os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("cannot write %s: %v", DevKmsg, err)
	}
	_, err = fmt.Fprintf(w, "NVRM: Xid (PCI:0000:3b:00): 13, pid=%d, name=probe-test, Graphics Exception\n", os.Getpid())
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Skipf("cannot write %s: %v", DevKmsg, err)
	}
	rep, err := Probe(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Readable {
		t.Skipf("cannot read %s: %s", DevKmsg, rep.Error)
	}
	if rep.Records == 0 || rep.Spoofed == 0 {
		t.Errorf("report %+v, want records and at least our spoofed line", rep)
	}
}
