package kmsg

import (
	"errors"
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
		}
	})
}
