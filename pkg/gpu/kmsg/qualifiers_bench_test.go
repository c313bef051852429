package kmsg

import (
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// BenchmarkSignalsOfOneLine parses one NVRM line and maps it to signals, per form: what a line
// costs beyond the record itself. NVLink XIDs pay for their qualifiers (the NVLinkError and the
// copy of the unit); other lines pay nothing new.
func BenchmarkSignalsOfOneLine(b *testing.B) {
	for _, bc := range []struct{ name, msg string }{
		{"plain", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."},
		{"causedBy", "NVRM: Xid (PCI:0000:3b:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"},
		{"nvlink5", "NVRM: Xid (PCI:0000:3b:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)"},
		{"xid74", "NVRM: Xid (PCI:0000:3b:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := NewMapper(inventory())
			at := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
			var buf []health.Signal
			b.ReportAllocs()
			for range b.N {
				ev, ok := ParseNVRM(bc.msg)
				if !ok {
					b.Fatal("no event")
				}
				var err error
				if buf, err = m.Signals(ev, at, buf[:0]); err != nil || len(buf) != 1 {
					b.Fatalf("Signals = %+v, %v", buf, err)
				}
			}
		})
	}
}
