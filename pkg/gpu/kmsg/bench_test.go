package kmsg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// benchInventory is an 8-GPU node at the PCI addresses of a DGX H100.
func benchInventory() []health.Device {
	buses := []string{"1b", "43", "52", "61", "9d", "c3", "d1", "df"}
	devs := make([]health.Device, len(buses))
	for i, b := range buses {
		devs[i] = health.Device{UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i), Index: i, PCIBusID: "00000000:" + b + ":00.0"}
	}
	return devs
}

// mixedLog returns n /dev/kmsg records as a busy GPU node's kernel logs them: one in ten is an
// NVRM line (XIDs of several forms and generations, MIG scopes, XID 154, lost and failed GPUs,
// identity lines, banners), one in a hundred a line written by a process, the rest ordinary
// kernel lines, some of them with escaped bytes and dictionaries.
func mixedLog(n int) []string {
	buses := []string{"1b", "43", "52", "61", "9d", "c3", "d1", "df"}
	nvrm := []string{
		"NVRM: Xid (PCI:0000:%s:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
		"NVRM: Xid (PCI:0000:%s:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
		"NVRM: Xid (PCI:0000:%s:00): 94, pid=4242, name=trainer, Ch 00000008, GPU-I 1, CI 0",
		"NVRM: Xid (PCI:0000:%s:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
		"NVRM: Xid (PCI:0000:%s:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
		"NVRM: Xid (PCI:0000:%s:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
		"NVRM: GPU at PCI:0000:%s:00: GPU-00000000-0000-0000-0000-000000000000",
		"NVRM: GPU 0000:%s:00.0: RmInitAdapter failed! (0x24:0x72:1568)",
		"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.158.01  Tue Jun 10 12:00:00 UTC 2025 (%s)",
		"NVRM: Xid (PCI:0000:%s:00): 31, pid=77, name=python3, Ch 00000009, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
	}
	other := []string{
		`3,%d,%d,-;nvme nvme0: I/O 123 QID 4 timeout, completion polled`,
		`6,%d,%d,-;IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready`,
		`4,%d,%d,-;TCP: request_sock_TCP: Possible SYN flooding on port 443. Sending cookies.  Check SNMP counters.`,
		`6,%d,%d,-;pci 0000:1b:00.0: [10de:2330] type 00 class 0x030200` + "\n SUBSYSTEM=pci\n DEVICE=+pci:0000:1b:00.0",
		`5,%d,%d,-;audit: type=1400 audit(1700000000.123:42): apparmor="DENIED" operation="open" profile="snap" name="/proc/\x5cx" pid=4242 comm="snapd"`,
		`6,%d,%d,-;eth0: renamed from veth1a2b3c4\x0asecond line`,
		`4,%d,%d,-;kauditd_printk_skb: 12 callbacks suppressed`,
		`6,%d,%d,-;cni0: port 3(veth9f8e7d6c) entered forwarding state`,
	}
	lines := make([]string, n)
	for i := range n {
		seq, usec := i+1, 1_000_000+i*1000
		switch {
		case i%100 == 7:
			lines[i] = fmt.Sprintf("11,%d,%d,-;"+nvrm[0], seq, usec, buses[i%len(buses)]) // spoofed
		case i%10 == 3:
			lines[i] = fmt.Sprintf("3,%d,%d,-;"+nvrm[(i/10)%len(nvrm)], seq, usec, buses[(i/100)%len(buses)])
		default:
			lines[i] = fmt.Sprintf(other[i%len(other)], seq, usec)
		}
	}
	return lines
}

// lineRecords serves formatted records, parsing each as the Reader does, then io.EOF.
type lineRecords struct {
	lines     []string
	next      int
	malformed uint64
}

func (l *lineRecords) Next(context.Context) (Record, error) {
	for l.next < len(l.lines) {
		r, err := ParseRecord(l.lines[l.next])
		l.next++
		if err != nil {
			l.malformed++
			continue
		}
		return r, nil
	}
	return Record{}, io.EOF
}
func (l *lineRecords) Overruns() uint64  { return 0 }
func (l *lineRecords) Malformed() uint64 { return l.malformed }
func (l *lineRecords) Close() error      { return nil }

// discardSink applies nothing; it keeps the benchmark on the parsing.
type discardSink struct{ signals int }

func (discardSink) Cursor(string) (health.Cursor, bool) { return health.Cursor{}, false }
func (d *discardSink) Advance(_ string, _ health.Cursor, sigs ...health.Signal) {
	d.signals += len(sigs)
}

// allocsPer measures the heap allocations of f.
func allocsPer(f func()) (allocs, bytes uint64) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.Mallocs - before.Mallocs, after.TotalAlloc - before.TotalAlloc
}

// BenchmarkParseMixedLog runs a Source over a 1,000,000-line kernel log of mixed NVRM and
// unrelated lines: every record parsed, NVRM lines turned into signals (de-duplicated against
// nothing), spoofed ones counted. One op is the whole log.
func BenchmarkParseMixedLog(b *testing.B) {
	const n = 1_000_000
	lines := mixedLog(n)
	devices := benchInventory()
	var allocs, bytes uint64
	b.ResetTimer()
	for range b.N {
		src := newSource(&lineRecords{lines: lines}, devices, SourceOptions{BootID: "b1", Dedup: health.NewDedup(0), clock: testClock})
		sink := &discardSink{}
		a, by := allocsPer(func() {
			if err := src.Run(context.Background(), sink); !errors.Is(err, io.EOF) {
				b.Fatal(err)
			}
		})
		allocs, bytes = allocs+a, bytes+by
		if st := src.Stats(); st.Records != n || st.Spoofed == 0 || sink.signals == 0 {
			b.Fatalf("stats %+v, %d signals", st, sink.signals)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
	b.ReportMetric(float64(allocs)/float64(n)/float64(b.N), "allocs/line")
	b.ReportMetric(float64(bytes)/float64(n)/float64(b.N), "B/line")
}

// ringSource serves records one per read, as /dev/kmsg does, and then reports that nothing
// more is there (EAGAIN once per op, as the non-blocking device does at its end).
type ringSource struct {
	records [][]byte
	next    int
}

func (r *ringSource) Read(p []byte) (int, error) {
	if r.next == len(r.records) {
		return 0, io.ErrUnexpectedEOF
	}
	n := copy(p, r.records[r.next])
	r.next++
	return n, nil
}
func (r *ringSource) SetReadDeadline(time.Time) error { return nil }
func (r *ringSource) Close() error                    { return nil }

// fullRing returns the records of a kernel log buffer of size bytes of text, full: what a
// start-up replay reads after a busy boot.
func fullRing(size int) [][]byte {
	var out [][]byte
	total := 0
	for _, l := range mixedLog(size / 40) { // more than enough lines; most are longer than 40 bytes
		_, msg, _ := cutMessage(l)
		if total+len(msg) > size {
			break
		}
		total += len(msg)
		out = append(out, []byte(l+"\n"))
	}
	return out
}

func cutMessage(record string) (prefix, msg string, ok bool) {
	for i := range len(record) {
		if record[i] == ';' {
			return record[:i], record[i+1:], true
		}
	}
	return "", record, false
}

// BenchmarkReplayRingBuffer is the start-up replay of a full 1 MiB kernel log buffer (the
// largest common CONFIG_LOG_BUF_SHIFT is 20; distributions default to 256 KiB or less) through
// the Reader, the Source and a real Monitor of 8 GPUs, with the checkpoint's cursor: "fresh" is
// a first start (every NVRM record applied), "restart" an agent restart after every record was
// applied (each skipped by its sequence number). One op is one replay.
func BenchmarkReplayRingBuffer(b *testing.B) {
	const size = 1 << 20
	records := fullRing(size)
	for _, restart := range []bool{false, true} {
		name := "fresh"
		if restart {
			name = "restart"
		}
		b.Run(fmt.Sprintf("buffer=1MiB/%s", name), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				tr, err := health.NewTracker(health.DefaultPolicy(), benchInventory())
				if err != nil {
					b.Fatal(err)
				}
				mon := health.NewMonitor(tr)
				if restart {
					mon.Advance(SourceName, health.Cursor{BootID: "b1", Seq: uint64(len(records))})
				}
				src := newSource(newReader(&ringSource{records: records}), benchInventory(), SourceOptions{BootID: "b1", clock: testClock})
				b.StartTimer()
				if err := src.Run(context.Background(), mon); !errors.Is(err, io.ErrUnexpectedEOF) {
					b.Fatal(err)
				}
				if st := src.Stats(); st.Records != uint64(len(records)) || (restart != (st.AlreadyApplied > 0)) || (restart == (st.Signals > 0)) {
					b.Fatalf("stats %+v after %d records", st, len(records))
				}
			}
			b.ReportMetric(float64(len(records)), "records")
			b.ReportMetric(b.Elapsed().Seconds()*1000/float64(b.N), "ms/replay")
		})
	}
}
