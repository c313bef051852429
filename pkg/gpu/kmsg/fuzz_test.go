package kmsg

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// FuzzSignals runs any message through the parser and the mapper, as the Source does: no input
// panics, a failure is one of the mapper's two errors, and every signal names a GPU of the
// inventory with a real XID code.
func FuzzSignals(f *testing.F) {
	for _, seed := range []string{
		"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
		"NVRM: Xid (PCI:0000:3b:00): 94, pid=4242, name=trainer, Ch 00000008, GPU-I 1, CI 0",
		"NVRM: Xid (PCI:0000:86:00): 154, GPU recovery action changed from 0x0 (None) to 0xffffffff (x)",
		"NVRM: Xid (PCI:0000:86:00): 43, pid=1, name=a, (GI 99999999999, CI 3)",
		"NVRM: GPU at PCI:0000:af:00: GPU-cccc",
		"NVRM: GPU 0000:86:00.0: RmInitAdapter failed! (0x24:0x72:1568)",
		"NVRM: The NVIDIA GPU 0000:3b:00.0\nNVRM: fallen off the bus",
		"NVRM: Xid (PCI:0000:3b:00): -1, x",
		"NVRM: Xid (0009:00): 53, CMDre",
		"NVRM: Xid (PCI:0000:3b:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
		"NVRM: Xid (PCI:0000:86:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
		"NVRM: Xid (PCI:0000:86:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406",
		"NVRM: Xid (PCI:0000:3b:00): 146, TLW_RX/TLW_RX_PIPE0 Nonfatal XC0 i0 Link 4294967309 (0x0000000a)",
		"NVRM: Xid (PCI:0000:3b:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
		"NVRM: Xid (PCI:0000:3b:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
		"NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
		"NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 43, pid=77, name=python3, Ch 00000009",
	} {
		f.Add(seed)
	}
	known := map[string]bool{}
	for _, d := range inventory() {
		known[d.UUID] = true
	}
	at := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, msg string) {
		ev, ok := ParseNVRM(msg)
		if !ok {
			return
		}
		m := NewMapper(inventory())
		sigs, err := m.Signals(ev, at, nil)
		if err != nil {
			if !errors.Is(err, ErrUnknownDevice) && !errors.Is(err, ErrBadXID) {
				t.Fatalf("Signals(%+v) error %v", ev, err)
			}
			if len(sigs) != 0 {
				t.Fatalf("Signals(%+v) = %+v with error %v", ev, sigs, err)
			}
			return
		}
		for _, s := range sigs {
			if !known[s.Device] || !s.Time.Equal(at) {
				t.Fatalf("Signals(%+v) = %+v: not a GPU of the inventory or not at %v", ev, s, at)
			}
			if s.Kind == health.SignalXID && (s.XID == 0 || int(s.XID) != ev.Xid) {
				t.Fatalf("Signals(%+v) gives XID %d", ev, s.XID)
			}
			if s.MIGScoped && (ev.MIG == nil || int(s.GPUInstance) != ev.MIG.GPUInstance) {
				t.Fatalf("Signals(%+v) scoped to %d", ev, s.GPUInstance)
			}
			checkQualifiers(t, ev, s)
		}
	})
}

// checkQualifiers holds what the mapper promises about an XID's qualifiers: a link only within
// what the library tracks and only from the line, a unit only short and printable, never both
// severities, and none on anything but an XID.
func checkQualifiers(t *testing.T, ev Event, s health.Signal) {
	t.Helper()
	if s.Kind != health.SignalXID {
		if s.XIDFlags != 0 || s.Unit != "" {
			t.Fatalf("Signals(%+v) gives a %v signal with XID qualifiers %+v", ev, s.Kind, s)
		}
		return
	}
	if s.XIDFlags&health.XIDHasLink != 0 && (ev.NVLink == nil || s.Link >= maxLinks || int(s.Link) != ev.NVLink.Link) {
		t.Fatalf("Signals(%+v) gives link %d", ev, s.Link)
	}
	if s.XIDFlags&health.XIDHasLink == 0 && s.Link != 0 {
		t.Fatalf("Signals(%+v) gives link %d without XIDHasLink", ev, s.Link)
	}
	if s.Unit != "" && (ev.NVLink == nil || s.Unit != ev.NVLink.Unit || !validUnit(s.Unit)) {
		t.Fatalf("Signals(%+v) gives unit %q", ev, s.Unit)
	}
	if s.XIDFlags&health.XIDFatal != 0 && s.XIDFlags&health.XIDNonfatal != 0 {
		t.Fatalf("Signals(%+v) is both Fatal and Nonfatal", ev)
	}
	if (s.XIDFlags&health.XIDCausedByPrevious != 0) != (ev.CausedByXid > 0) {
		t.Fatalf("Signals(%+v) gives flags %b for a cause of %d", ev, s.XIDFlags, ev.CausedByXid)
	}
}

// FuzzRelayLines runs any lines through a RelayReader's parsing, as a relay's connection would
// deliver them: no input panics, each line is a record, an overrun or a malformed line, exactly
// one of them, and the records come out in strictly increasing order.
func FuzzRelayLines(f *testing.F) {
	for _, seed := range []string{
		"r 3,1109,11994683623,-;NVRM: Xid (0000:4f:00): 79, IN= OUT=lo\no 7\nr 3,1110,11994683624,-;NVRM: x",
		"r 3,5,1,-;a\nr 3,4,1,-;b\nr 3,5,1,-;c",
		"o -1\no 18446744073709551616\nx\nr \nr 3,1,1,;",
		"r 3,1,1,-;\\x0a\\xZZ\n\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, input string) {
		r := &RelayReader{}
		lines := strings.Split(input, "\n")
		records, last := uint64(0), uint64(0)
		for _, l := range lines {
			rec, ok := r.parse([]byte(l))
			if !ok {
				continue
			}
			if records > 0 && rec.Seq <= last {
				t.Fatalf("record %d after %d", rec.Seq, last)
			}
			records, last = records+1, rec.Seq
		}
		if got := records + r.Overruns() + r.Malformed(); got != uint64(len(lines)) {
			t.Fatalf("%d records, %d overruns, %d malformed of %d lines", records, r.Overruns(), r.Malformed(), len(lines))
		}
	})
}
