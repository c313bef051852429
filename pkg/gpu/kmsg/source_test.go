package kmsg

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// boot is when the test's kernel booted; the fake clock says it has been up for an hour.
var (
	boot   = time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	uptime = time.Hour
)

func testClock() (time.Time, time.Duration) { return boot.Add(uptime), uptime }

// inventory is two GPUs, one of them with MIG instances (which the mapper leaves aside), and a
// third whose bus ID NVML could not read.
func inventory() []health.Device {
	return []health.Device{
		{UUID: "GPU-aaaa", Index: 0, PCIBusID: "00000000:3B:00.0"},
		{UUID: "MIG-aaaa-1", Index: 0, PCIBusID: "00000000:3B:00.0", MIG: &health.MIGPlacement{ParentUUID: "GPU-aaaa", GPUInstance: 1}},
		{UUID: "GPU-bbbb", Index: 1, PCIBusID: "00000000:86:00.0"},
		{UUID: "GPU-cccc", Index: 2},
	}
}

// fakeSink records what a Source applies.
type fakeSink struct {
	mu      sync.Mutex
	cursor  *health.Cursor
	applied []applied
}

type applied struct {
	to   health.Cursor
	sigs []health.Signal
}

func (f *fakeSink) Cursor(string) (health.Cursor, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cursor == nil {
		return health.Cursor{}, false
	}
	return *f.cursor, true
}

func (f *fakeSink) Advance(source string, to health.Cursor, sigs ...health.Signal) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, applied{to: to, sigs: append([]health.Signal(nil), sigs...)})
}

func (f *fakeSink) signals() []health.Signal {
	f.mu.Lock()
	defer f.mu.Unlock()
	var all []health.Signal
	for _, a := range f.applied {
		all = append(all, a.sigs...)
	}
	return all
}

// runSource runs a Source over reads until it has read n records, stops it and returns it.
func runSource(t *testing.T, sink ReplaySink, opts SourceOptions, n uint64, reads ...fakeRead) *Source {
	t.Helper()
	if opts.clock == nil {
		opts.clock = testClock
	}
	src := newSource(newReader(newFakeSource(reads...)), inventory(), opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	deadline := time.Now().Add(safetyNet)
	for src.Stats().Records+src.Stats().Malformed < n {
		if time.Now().After(deadline) {
			t.Fatalf("the source read %+v, want %d records", src.Stats(), n)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
	return src
}

// kernel formats a kernel-facility record at level err, time since boot in seconds.
func kernel(seq uint64, sec float64, msg string) fakeRead {
	return fakeRead{data: Record{Facility: FacilityKernel, Level: LevelErr, Seq: seq, Since: time.Duration(sec * float64(time.Second)), Flags: "-", Message: msg}.String() + "\n"}
}

func TestSourceTurnsKernelRecordsIntoSignals(t *testing.T) {
	at := func(sec float64) time.Time { return boot.Add(time.Duration(sec * float64(time.Second))) }
	sink := &fakeSink{}
	src := runSource(t, sink, SourceOptions{BootID: "b1"}, 9,
		kernel(1, 1, "pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200"),
		kernel(2, 10, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
		kernel(3, 11, "NVRM: Xid (PCI:0000:3b:00): 94, pid=4242, name=trainer, Ch 00000008, GPU-I 1, CI 0"),
		kernel(4, 12, "NVRM: Xid (PCI:0000:86:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"),
		// GPU-cccc has no bus ID in the inventory: its identity line gives it one.
		kernel(5, 13, "NVRM: GPU at PCI:0000:af:00: GPU-cccc"),
		kernel(6, 14, "NVRM: Xid (PCI:0000:af:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."),
		kernel(7, 15, "NVRM: GPU 0000:86:00.0: RmInitAdapter failed! (0x24:0x72:1568)"),
		kernel(8, 16, "NVRM: The NVIDIA GPU 0000:3b:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."),
		// A record logged "after" the moment it is read (clocks apart) is placed at that moment.
		kernel(9, 7200, "NVRM: Xid (PCI:0000:86:00): 13, pid=1, name=a, Graphics Exception"),
	)
	want := []health.Signal{
		{Kind: health.SignalXID, Device: "GPU-aaaa", Time: at(10), XID: 79},
		{Kind: health.SignalXID, Device: "GPU-aaaa", Time: at(11), XID: 94, MIGScoped: true, GPUInstance: 1, ComputeInstance: 0},
		{Kind: health.SignalXID, Device: "GPU-bbbb", Time: at(12), XID: 154},
		{Kind: health.SignalRecoveryAction, Device: "GPU-bbbb", Time: at(12), Action: health.RecoveryNodeReboot},
		{Kind: health.SignalXID, Device: "GPU-cccc", Time: at(14), XID: 48},
		{Kind: health.SignalLost, Device: "GPU-bbbb", Time: at(15)},
		{Kind: health.SignalLost, Device: "GPU-aaaa", Time: at(16)},
		{Kind: health.SignalXID, Device: "GPU-bbbb", Time: boot.Add(uptime), XID: 13},
	}
	if got := sink.signals(); !reflect.DeepEqual(got, want) {
		t.Errorf("signals:\n got %+v\nwant %+v", got, want)
	}
	var seqs []uint64
	for _, a := range sink.applied {
		seqs = append(seqs, a.to.Seq)
		if a.to.BootID != "b1" {
			t.Errorf("cursor %+v names another boot", a.to)
		}
	}
	if want := []uint64{2, 3, 4, 6, 7, 8, 9}; !reflect.DeepEqual(seqs, want) {
		t.Errorf("cursors advanced to %v, want %v (only records with signals move it)", seqs, want)
	}
	if st := src.Stats(); st.Records != 9 || st.Signals != 8 || st.UnknownDevice != 0 || st.Spoofed != 0 {
		t.Errorf("stats = %+v", st)
	}
}

func TestSourceCountsAndSkipsBadInput(t *testing.T) {
	sink := &fakeSink{}
	epipe := &os.PathError{Op: "read", Path: DevKmsg, Err: syscall.EPIPE}
	long := "NVRM: Xid (PCI:0000:3b:00): 79, " + string(make([]byte, 7000))
	src := runSource(t, sink, SourceOptions{BootID: "b1"}, 12,
		fakeRead{data: "garbage without a prefix\n"},                                // malformed
		fakeRead{data: "6,x,1,-;NVRM: Xid (PCI:0000:3b:00): 79, truncated"},         // malformed sequence number
		fakeRead{data: "\x00\xff\x01;\x80\x81"},                                     // binary
		kernel(1, 1, "NVRM: Xid (PCI:0000:99:00): 79, GPU has fallen off the bus."), // unknown PCI ID
		kernel(2, 2, "NVRM: GPU at PCI:0000:99:00: GPU-not-ours"),                   // unknown UUID
		kernel(3, 3, "NVRM: Xid (0009:00): 53, CMDre 00000000"),                     // an address too old to attribute
		kernel(4, 4, "NVRM: Xid (PCI:0000:3b:00): 0, nothing"),                      // impossible XID
		kernel(5, 5, "NVRM: Xid (PCI:0000:3b:00): 99999999999, nothing"),            // impossible XID
		fakeRead{err: epipe},
		kernel(40, 6, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01"), // not about health
		kernel(41, 7, long), // over-long, still read
		// Facility user: what `echo ... > /dev/kmsg` writes.
		fakeRead{data: Record{Facility: FacilityUser, Level: LevelErr, Seq: 42, Flags: "-", Message: "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."}.String()},
		kernel(43, 8, "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, b"),
	)
	st := src.Stats()
	want := Stats{Records: 9, Signals: 2, Spoofed: 1, Malformed: 3, Overruns: 1, UnknownDevice: 3, BadXID: 2}
	if st != want {
		t.Errorf("stats = %+v\nwant    %+v", st, want)
	}
	got := sink.signals()
	if len(got) != 2 || got[0].XID != 79 || got[1].XID != 13 || got[0].Device != "GPU-aaaa" {
		t.Errorf("signals = %+v, want XID 79 (the over-long line) and XID 13 on GPU-aaaa", got)
	}
}

func TestSourceResumesAfterItsCursorInTheSameBootOnly(t *testing.T) {
	reads := func() []fakeRead {
		return []fakeRead{
			kernel(10, 1, "NVRM: GPU at PCI:0000:af:00: GPU-cccc"),
			kernel(11, 2, "NVRM: Xid (PCI:0000:af:00): 79, GPU has fallen off the bus."),
			kernel(12, 3, "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, b"),
			kernel(13, 4, "NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, b"),
		}
	}
	tests := []struct {
		name     string
		cursor   *health.Cursor
		wantXIDs []uint32
		already  uint64
	}{
		{name: "no cursor replays everything", wantXIDs: []uint32{79, 13, 31}},
		{name: "same boot resumes after the cursor", cursor: &health.Cursor{BootID: "b1", Seq: 12}, wantXIDs: []uint32{31}, already: 2},
		// The identity line before the cursor still maps GPU-cccc: seq 11 is skipped only
		// because it was applied, not because its GPU is unknown.
		{name: "cursor between identity and XID", cursor: &health.Cursor{BootID: "b1", Seq: 10}, wantXIDs: []uint32{79, 13, 31}},
		{name: "another boot's cursor is ignored", cursor: &health.Cursor{BootID: "b0", Seq: 12}, wantXIDs: []uint32{79, 13, 31}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sink := &fakeSink{cursor: tc.cursor}
			src := runSource(t, sink, SourceOptions{BootID: "b1"}, 4, reads()...)
			var xids []uint32
			for _, s := range sink.signals() {
				xids = append(xids, s.XID)
			}
			if !reflect.DeepEqual(xids, tc.wantXIDs) {
				t.Errorf("XIDs applied = %v, want %v", xids, tc.wantXIDs)
			}
			if got := src.Stats().AlreadyApplied; got != tc.already {
				t.Errorf("AlreadyApplied = %d, want %d", got, tc.already)
			}
		})
	}
}

func TestSourceDropsXIDsNVMLReported(t *testing.T) {
	d := health.NewDedup(time.Second)
	// NVML saw XID 79 on GPU-aaaa a moment after the driver logged it (10s after boot).
	if !d.Admit("nvml", health.Signal{Kind: health.SignalXID, Device: "GPU-aaaa", XID: 79, Time: boot.Add(10*time.Second + 300*time.Millisecond)}) {
		t.Fatal("NVML's first report was not admitted")
	}
	sink := &fakeSink{}
	src := runSource(t, sink, SourceOptions{BootID: "b1", Dedup: d}, 2,
		kernel(1, 10, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
		kernel(2, 30, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
	)
	got := sink.signals()
	if len(got) != 1 || !got[0].Time.Equal(boot.Add(30*time.Second)) {
		t.Errorf("signals = %+v, want only the second XID 79 (the first was NVML's)", got)
	}
	// The cursor still moves past the duplicate, so a restart does not offer it again.
	if len(sink.applied) != 2 || sink.applied[0].to.Seq != 1 || len(sink.applied[0].sigs) != 0 {
		t.Errorf("applied = %+v, want an empty advance to seq 1, then seq 2", sink.applied)
	}
	if st := src.Stats(); st.Duplicates != 1 || st.Signals != 1 {
		t.Errorf("stats = %+v, want 1 duplicate, 1 signal", st)
	}
	want := map[string]health.DedupStats{"nvml": {Reported: 1}, SourceName: {Reported: 2, Duplicates: 1}}
	if got := d.Stats(); !reflect.DeepEqual(got, want) {
		t.Errorf("dedup stats = %+v, want %+v", got, want)
	}
}

func TestSourceReturnsReadErrors(t *testing.T) {
	src := newSource(newReader(newFakeSource(fakeRead{err: syscall.EIO})), inventory(), SourceOptions{clock: testClock})
	err := src.Run(context.Background(), &fakeSink{})
	if err == nil {
		t.Fatal("Run = nil, want the read error")
	}
	if want := fmt.Sprint(syscall.EIO); !strings.Contains(err.Error(), want) {
		t.Errorf("Run = %v, want it to say %q", err, want)
	}
}
