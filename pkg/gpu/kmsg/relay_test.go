package kmsg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// feed is a record source the test writes to, as the kernel writes /dev/kmsg: each item sent is
// the next record read; one marked overrun is read as after an EPIPE.
type feed struct {
	ch       chan feedItem
	overruns atomic.Uint64
}

type feedItem struct {
	rec     Record
	overrun bool
}

func newFeed() *feed { return &feed{ch: make(chan feedItem, 1024)} }

func (f *feed) Next(ctx context.Context) (Record, error) {
	select {
	case it := <-f.ch:
		if it.overrun {
			f.overruns.Add(1)
		}
		return it.rec, nil
	case <-ctx.Done():
		return Record{}, ctx.Err()
	}
}

func (f *feed) Overruns() uint64  { return f.overruns.Load() }
func (f *feed) Malformed() uint64 { return 0 }
func (f *feed) Close() error      { return nil }

func (f *feed) send(recs ...Record) {
	for _, r := range recs {
		f.ch <- feedItem{rec: r}
	}
}

// rec is a kernel-facility record at level err.
func rec(seq uint64, msg string) Record {
	return Record{Facility: FacilityKernel, Level: LevelErr, Seq: seq, Since: time.Duration(seq) * time.Second, Flags: "-", Message: msg}
}

// socketPath is a path for a Unix socket short enough for sun_path.
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "relay.sock")
}

// runningRelay is a Relay reading a feed and serving a socket until stop.
type runningRelay struct {
	*Relay
	feed   *feed
	socket string
	stop   func()
}

func startRelay(t *testing.T, socket string, opts RelayOptions) *runningRelay {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	r := &runningRelay{Relay: NewRelay(opts), feed: newFeed(), socket: socket}
	ctx, cancel := context.WithCancel(context.Background())
	read, served := make(chan error, 1), make(chan error, 1)
	go func() { read <- r.read(ctx, r.feed) }()
	go func() { served <- r.Serve(ctx, ln) }()
	stopped := false
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-read; err != nil {
			t.Errorf("read = %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve = %v", err)
		}
	}
	t.Cleanup(r.stop)
	return r
}

// waitRead waits until the relay has read n records.
func (r *runningRelay) waitRead(t *testing.T, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(safetyNet); r.Stats().Records < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the relay read %+v, want %d records", r.Stats(), n)
		}
	}
}

func dial(t *testing.T, socket, boot string) *RelayReader {
	t.Helper()
	c, err := DialRelay(socket, boot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// next reads n records from c.
func next(t *testing.T, c *RelayReader, n int) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), safetyNet)
	defer cancel()
	var out []Record
	for range n {
		r, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("after %d records: %v", len(out), err)
		}
		out = append(out, r)
	}
	return out
}

func TestRelayHandsOnOnlyTheDriversRecords(t *testing.T) {
	r := startRelay(t, socketPath(t), RelayOptions{BootID: "b1"})
	withDict := rec(4, "NVRM: GPU at PCI:0000:3b:00: GPU-aaaa")
	withDict.Dict = map[string]string{"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
	spoofed := rec(3, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=spoof, GPU has fallen off the bus.")
	spoofed.Facility = FacilityUser
	r.feed.send(
		rec(1, "pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200"),
		rec(2, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.163.01"),
		spoofed,
		withDict,
		rec(5, "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."),
		rec(6, `NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=C:\app, Graphics Exception`),
	)
	r.waitRead(t, 6)
	got := next(t, dial(t, r.socket, "b1"), 4)
	want := []Record{rec(2, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.163.01"), rec(4, withDict.Message), rec(5, "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."), rec(6, `NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=C:\app, Graphics Exception`)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("records:\n got %+v\nwant %+v", got, want)
	}
	if s := r.Stats(); s != (RelayStats{Records: 6, Forwarded: 4, Spoofed: 1}) {
		t.Errorf("stats %+v", s)
	}
}

// A client gets everything held when it connects, then each record as it is read; one that
// connects later gets the same, and both are told of a kernel overrun where it happened.
func TestRelayServesEarlyAndLateClientsAlike(t *testing.T) {
	r := startRelay(t, socketPath(t), RelayOptions{BootID: "b1"})
	early := dial(t, r.socket, "b1")
	r.feed.send(rec(1, "NVRM: Xid (PCI:0000:3b:00): 13, a"))
	if got := next(t, early, 1); got[0].Seq != 1 {
		t.Fatalf("early client got %+v", got)
	}
	r.feed.ch <- feedItem{rec: rec(9, "NVRM: Xid (PCI:0000:3b:00): 13, b"), overrun: true}
	r.feed.send(rec(10, "usb 1-1: new device"), rec(11, "NVRM: Xid (PCI:0000:3b:00): 13, c"))
	r.waitRead(t, 4)
	late := dial(t, r.socket, "")
	for name, c := range map[string]*RelayReader{"early": early, "late": late} {
		var seqs []uint64
		for _, rc := range next(t, c, map[string]int{"early": 2, "late": 3}[name]) {
			seqs = append(seqs, rc.Seq)
		}
		want := map[string][]uint64{"early": {9, 11}, "late": {1, 9, 11}}[name]
		if !reflect.DeepEqual(seqs, want) || c.Overruns() != 1 || c.Lost() != 7 {
			t.Errorf("%s client: seqs %v, overruns %d, lost %d; want %v, 1 overrun of 7 records (2..8)", name, seqs, c.Overruns(), c.Lost(), want)
		}
	}
}

// The relay holds at most MaxBytes of lines: a client that falls behind by more is told how
// many it missed, and every record is either received, in order, or counted as lost.
func TestRelayBoundsWhatItHoldsForASlowClient(t *testing.T) {
	const total = 20000
	r := startRelay(t, socketPath(t), RelayOptions{BootID: "b1", MaxBytes: 8 << 10})
	slow := dial(t, r.socket, "b1")
	for seq := uint64(1); seq <= total; seq++ {
		r.feed.send(rec(seq, fmt.Sprintf("NVRM: Xid (PCI:0000:3b:00): 13, pid=%d, name=storm, Graphics Exception", seq)))
	}
	r.waitRead(t, total)
	r.mu.Lock()
	held, bytes := len(r.held), r.bytes
	r.mu.Unlock()
	if bytes > 8<<10 || held == 0 {
		t.Errorf("holds %d lines, %d bytes; want at most 8 KiB", held, bytes)
	}
	ctx, cancel := context.WithTimeout(context.Background(), safetyNet)
	defer cancel()
	received, last := uint64(0), uint64(0)
	for last < total {
		rc, err := slow.Next(ctx)
		if err != nil {
			t.Fatalf("after %d records (last %d): %v", received, last, err)
		}
		if rc.Seq <= last {
			t.Fatalf("record %d after %d", rc.Seq, last)
		}
		received, last = received+1, rc.Seq
	}
	if received+slow.Lost() != total || slow.Overruns() == 0 || slow.Lost() == 0 {
		t.Errorf("received %d, lost %d in %d overruns; want them to add up to %d with some lost", received, slow.Lost(), slow.Overruns(), total)
	}
}

func TestRelayThatCannotReadSaysWhy(t *testing.T) {
	r := startRelay(t, socketPath(t), RelayOptions{BootID: "b1"})
	r.Fail("open kernel log: open /dev/kmsg: operation not permitted (not permitted: ...)\nsecond line")
	_, err := DialRelay(r.socket, "b1")
	if !errors.Is(err, ErrRelayRefused) || !strings.Contains(err.Error(), "operation not permitted (not permitted: ...) second line") {
		t.Errorf("DialRelay = %v, want ErrRelayRefused with the relay's reason on one line", err)
	}
	if h := Hint(err); h != "" {
		t.Errorf("Hint = %q, want none beside the relay's own", h)
	}
}

func TestDialRelayRefusals(t *testing.T) {
	r := startRelay(t, socketPath(t), RelayOptions{BootID: "b1", MaxClients: 1})
	first := dial(t, r.socket, "b1")
	if _, err := DialRelay(r.socket, "b1"); !errors.Is(err, ErrRelayRefused) || !strings.Contains(err.Error(), "too many clients (1)") {
		t.Errorf("a second client past MaxClients 1: %v", err)
	}
	// Hanging up frees the slot, although no record came to write.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(safetyNet); ; time.Sleep(time.Millisecond) {
		c, err := DialRelay(r.socket, "b1")
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot was never freed: %v", err)
		}
	}
	other := startRelay(t, socketPath(t), RelayOptions{BootID: "b1"})
	if _, err := DialRelay(other.socket, "b2"); !errors.Is(err, ErrRelayRefused) || !strings.Contains(err.Error(), "boot b1, this is boot b2") {
		t.Errorf("another boot: %v", err)
	}
	_, err := DialRelay(filepath.Join(filepath.Dir(r.socket), "none.sock"), "b1")
	if !errors.Is(err, ErrRelayUnreachable) || !strings.Contains(Hint(err), "kmsg-relay") {
		t.Errorf("no relay: %v, hint %q", err, Hint(err))
	}
}

// fakeRelay accepts one client and writes it lines; write sends more later.
func fakeRelay(t *testing.T, lines ...string) (socket string, write func(string), hangup func()) {
	t.Helper()
	socket = socketPath(t)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		_ = ln.Close()
		if err == nil {
			_, _ = c.Write([]byte(strings.Join(lines, "")))
			conns <- c
		}
		close(conns)
	}()
	var conn net.Conn
	get := func() net.Conn {
		if conn == nil {
			conn = <-conns
		}
		return conn
	}
	t.Cleanup(func() {
		if c := get(); c != nil {
			_ = c.Close()
		}
	})
	return socket, func(s string) { _, _ = get().Write([]byte(s)) }, func() { _ = get().Close() }
}

// A RelayReader trusts no line: what does not parse, a record out of order and a line longer
// than any record are counted and skipped; the relay hanging up is an error.
func TestRelayReaderSkipsWhatIsNotARecord(t *testing.T) {
	r5 := "r " + rec(5, "NVRM: Xid (PCI:0000:3b:00): 13, five").String() + "\n"
	socket, _, hangup := fakeRelay(t,
		"gpuhealth-kmsg-relay/1 boot=b1\n",
		"r not a record\n",
		"x a later kind of line\n",
		"r "+strings.Repeat("y", 3*maxRelayLine)+"\n",
		r5,
		"r "+rec(3, "NVRM: Xid (PCI:0000:3b:00): 13, three").String()+"\n",
		"o seven\n",
		"o 7\n",
		"r "+rec(9, "NVRM: Xid (PCI:0000:3b:00): 13, nine").String()+"\n",
	)
	c := dial(t, socket, "b1")
	got := next(t, c, 2)
	if got[0].Seq != 5 || got[1].Seq != 9 || got[1].Message != "NVRM: Xid (PCI:0000:3b:00): 13, nine" {
		t.Errorf("records %+v, want 5 and 9", got)
	}
	if c.Malformed() != 5 || c.Overruns() != 1 || c.Lost() != 7 {
		t.Errorf("malformed %d, overruns %d, lost %d; want 5, 1, 7", c.Malformed(), c.Overruns(), c.Lost())
	}
	hangup()
	if _, err := c.Next(context.Background()); err == nil || !strings.Contains(err.Error(), "hung up") {
		t.Errorf("Next after the relay hung up = %v", err)
	}
}

// A cancelled Next returns at once and loses nothing: half a line read before the cancel is
// completed by the next call.
func TestRelayReaderNextCancelled(t *testing.T) {
	line := "r " + rec(5, "NVRM: Xid (PCI:0000:3b:00): 13, five").String() + "\n"
	socket, write, _ := fakeRelay(t, "gpuhealth-kmsg-relay/1 boot=b1\n", line[:20])
	c := dial(t, socket, "b1")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Next(ctx)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond) // let Next block; not what the test asserts on
	cancel()
	if err := waitErr(t, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next = %v, want context.Canceled", err)
	}
	write(line[20:])
	if got := next(t, c, 1); got[0].Seq != 5 || c.Malformed() != 0 {
		t.Errorf("after the cancel: %+v, malformed %d", got, c.Malformed())
	}
}

// A Source reading from a relay logs the records the relay says were lost, not the gap in the
// sequence numbers (which counts every record the relay leaves out).
func TestSourceOverARelayLogsWhatTheRelayLost(t *testing.T) {
	socket, _, _ := fakeRelay(t,
		"gpuhealth-kmsg-relay/1 boot=b1\n",
		"r "+rec(5, "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, Graphics Exception").String()+"\n",
		"o 3\n",
		"r "+rec(90, "NVRM: Xid (PCI:0000:3b:00): 13, pid=2, name=b, Graphics Exception").String()+"\n",
	)
	src, err := OpenSource(inventory(), SourceOptions{RelaySocket: socket, BootID: "b1", clock: testClock})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var l healthtest.Log
	sink := &fakeSink{}
	ctx, cancel := context.WithCancel(l.Context())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	for deadline := time.Now().Add(safetyNet); len(sink.signals()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("signals %+v, want two XIDs", sink.signals())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if lines := l.Containing("overwrote", `"lost"=3`); len(lines) != 1 {
		t.Errorf("logged %q, want one overrun of 3 records", l.Lines())
	}
}
