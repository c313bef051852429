package kmsg

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// TestSignalsCarryTheXIDQualifiers checks what reaches the library from the driver's words beside
// an XID code, and that a qualifier that cannot be right is dropped without losing the XID.
func TestSignalsCarryTheXIDQualifiers(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		msg       string
		wantXID   uint32
		wantFlag  health.XIDFlags
		wantLink  uint32
		wantUnit  string
		wantCause uint32
	}{
		{
			name:    "an XID without qualifiers has none",
			msg:     "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
			wantXID: 79,
		},
		{
			name:     "NVLink5 Nonfatal with a link",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
			wantXID:  145,
			wantFlag: health.XIDNonfatal | health.XIDHasLink,
			wantLink: 13,
			wantUnit: "RLW_RXPIPE",
		},
		{
			name:     "NVLink5 Fatal on link 0 has a link",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
			wantXID:  149,
			wantFlag: health.XIDFatal | health.XIDHasLink,
			wantUnit: "NETIR_LINK_EVT",
		},
		{
			name:     "NVLink5 Link -1 names no link",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
			wantXID:  149,
			wantFlag: health.XIDFatal,
			wantUnit: "NETIR",
		},
		{
			name:     "the highest link the library tracks",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 63 (0x1)",
			wantXID:  145,
			wantFlag: health.XIDNonfatal | health.XIDHasLink,
			wantLink: 63,
			wantUnit: "RLW_RXPIPE",
		},
		{
			name:     "a link beyond what the library tracks is dropped",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 64 (0x1)",
			wantXID:  145,
			wantFlag: health.XIDNonfatal,
			wantUnit: "RLW_RXPIPE",
		},
		{
			name:     "a link beyond 32 bits is dropped",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 4294967309 (0x1)",
			wantXID:  145,
			wantFlag: health.XIDNonfatal,
			wantUnit: "RLW_RXPIPE",
		},
		{
			name:     "an unreadable link is dropped",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link x (0x1)",
			wantXID:  145,
			wantFlag: health.XIDNonfatal,
			wantUnit: "RLW_RXPIPE",
		},
		{
			name:     "a unit of 32 characters is kept",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 147, " + strings.Repeat("T", 32) + " Nonfatal XC0 i0 Link 2 (0x1)",
			wantXID:  147,
			wantFlag: health.XIDNonfatal | health.XIDHasLink,
			wantLink: 2,
			wantUnit: strings.Repeat("T", 32),
		},
		{
			name:     "a unit longer than 32 characters is dropped",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 147, " + strings.Repeat("T", 33) + " Nonfatal XC0 i0 Link 2 (0x1)",
			wantXID:  147,
			wantFlag: health.XIDNonfatal | health.XIDHasLink,
			wantLink: 2,
		},
		{
			name:     "a unit with a control byte is dropped",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 147, TR\x01EX Fatal XC0 i0 Link 2 (0x1)",
			wantXID:  147,
			wantFlag: health.XIDFatal | health.XIDHasLink,
			wantLink: 2,
		},
		{
			name:     "a unit that is not ASCII is dropped",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 147, TRÉX Fatal XC0 i0 Link 2 (0x1)",
			wantXID:  147,
			wantFlag: health.XIDFatal | health.XIDHasLink,
			wantLink: 2,
		},
		{
			name:     "XID 74 is fatal on a link, no unit",
			msg:      "NVRM: Xid (PCI:0000:3b:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
			wantXID:  74,
			wantFlag: health.XIDFatal | health.XIDHasLink,
			wantLink: 14,
		},
		{
			name:      "caused by a previous XID",
			msg:       "NVRM: Xid (PCI:0000:3b:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
			wantXID:   45,
			wantFlag:  health.XIDCausedByPrevious,
			wantCause: 149,
		},
		{
			name:    "caused by a number that cannot be an XID",
			msg:     "NVRM: Xid (PCI:0000:3b:00): 45, Ch 00000001 caused by previous Xid 0",
			wantXID: 45,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev, ok := ParseNVRM(tc.msg)
			if !ok {
				t.Fatalf("ParseNVRM(%q) found no event", tc.msg)
			}
			sigs, err := NewMapper(inventory()).Signals(ev, at, nil)
			if err != nil || len(sigs) != 1 {
				t.Fatalf("Signals(%+v) = %+v, %v; want one XID signal", ev, sigs, err)
			}
			want := health.Signal{Kind: health.SignalXID, Device: "GPU-aaaa", Time: at, XID: tc.wantXID,
				XIDFlags: tc.wantFlag, Link: tc.wantLink, Unit: tc.wantUnit, CauseXID: tc.wantCause}
			if sigs[0] != want {
				t.Errorf("Signals(%q)\n got %+v\nwant %+v", tc.msg, sigs[0], want)
			}
		})
	}
}

// An XID 154 line keeps its recovery action alongside an XID signal that has no qualifiers.
func TestSignalsRecoveryActionHasNoQualifiers(t *testing.T) {
	ev, ok := ParseNVRM("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")
	if !ok {
		t.Fatal("no event")
	}
	sigs, err := NewMapper(inventory()).Signals(ev, time.Time{}, nil)
	if err != nil || len(sigs) != 2 {
		t.Fatalf("Signals = %+v, %v; want the XID and the recovery action", sigs, err)
	}
	for _, s := range sigs {
		if s.XIDFlags != 0 || s.Unit != "" || s.Link != 0 {
			t.Errorf("signal %+v carries qualifiers the line does not have", s)
		}
	}
}

// An XID the driver attributes to a MIG instance beside its address reaches the library scoped to
// that instance, on its physical GPU.
func TestSignalsOfAMIGAttributedXID(t *testing.T) {
	ev, ok := ParseNVRM("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 43, pid=77, name=python3, Ch 00000009")
	if !ok {
		t.Fatal("no event")
	}
	sigs, err := NewMapper(inventory()).Signals(ev, time.Time{}, nil)
	if err != nil || len(sigs) != 1 {
		t.Fatalf("Signals = %+v, %v; want one XID signal", sigs, err)
	}
	want := health.Signal{Kind: health.SignalXID, Device: "GPU-aaaa", XID: 43, MIGScoped: true, GPUInstance: 1, ComputeInstance: 2}
	if sigs[0] != want {
		t.Errorf("Signals\n got %+v\nwant %+v", sigs[0], want)
	}
}
