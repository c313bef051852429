package kmsg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// safetyNet bounds tests that wait on the kernel; it is never what a test asserts on.
const safetyNet = 30 * time.Second

// fakeSource replays canned read results; once they run out, Read waits until a deadline in
// the past is set, as a file in Go's poller does.
type fakeSource struct {
	mu      sync.Mutex
	reads   []fakeRead
	expired chan struct{}
}

type fakeRead struct {
	data string
	err  error
}

func newFakeSource(reads ...fakeRead) *fakeSource {
	return &fakeSource{reads: reads, expired: make(chan struct{})}
}

func (f *fakeSource) Read(p []byte) (int, error) {
	f.mu.Lock()
	if len(f.reads) == 0 {
		expired := f.expired
		f.mu.Unlock()
		<-expired
		return 0, os.ErrDeadlineExceeded
	}
	r := f.reads[0]
	f.reads = f.reads[1:]
	f.mu.Unlock()
	return copy(p, r.data), r.err
}

func (f *fakeSource) SetReadDeadline(t time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !t.IsZero() && t.Before(time.Now()) {
		close(f.expired)
	} else {
		f.expired = make(chan struct{})
	}
	return nil
}

func (f *fakeSource) Close() error { return nil }

func TestReaderNext(t *testing.T) {
	epipe := &os.PathError{Op: "read", Path: DevKmsg, Err: syscall.EPIPE}
	tests := []struct {
		name          string
		reads         []fakeRead
		wantMsgs      []string
		wantOverruns  uint64
		wantMalformed uint64
	}{
		{
			name:     "one record per read",
			reads:    []fakeRead{{data: "6,1,10,-;first\n"}, {data: "3,2,20,-;second\n"}},
			wantMsgs: []string{"first", "second"},
		},
		{
			name:         "EPIPE counts an overrun and the next record follows",
			reads:        []fakeRead{{data: "6,1,10,-;before\n"}, {err: epipe}, {data: "6,9,90,-;after overrun\n"}},
			wantMsgs:     []string{"before", "after overrun"},
			wantOverruns: 1,
		},
		{
			name:          "malformed records are skipped and counted",
			reads:         []fakeRead{{data: "garbage\n"}, {data: "6,x,1,-;bad seq\n"}, {data: "6,3,30,-;good\n"}},
			wantMsgs:      []string{"good"},
			wantMalformed: 2,
		},
		{
			name:     "EAGAIN means no record yet",
			reads:    []fakeRead{{err: syscall.EAGAIN}, {data: "6,4,40,-;late\n"}},
			wantMsgs: []string{"late"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newReader(newFakeSource(tc.reads...))
			ctx, cancel := context.WithTimeout(t.Context(), safetyNet)
			defer cancel()
			for _, want := range tc.wantMsgs {
				rec, err := r.Next(ctx)
				if err != nil {
					t.Fatalf("Next: %v", err)
				}
				if rec.Message != want {
					t.Errorf("Next message = %q, want %q", rec.Message, want)
				}
			}
			if got := r.Overruns(); got != tc.wantOverruns {
				t.Errorf("Overruns = %d, want %d", got, tc.wantOverruns)
			}
			if got := r.Malformed(); got != tc.wantMalformed {
				t.Errorf("Malformed = %d, want %d", got, tc.wantMalformed)
			}
		})
	}
}

func TestReaderNextReadError(t *testing.T) {
	r := newReader(newFakeSource(fakeRead{err: io.ErrUnexpectedEOF}))
	if _, err := r.Next(t.Context()); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Next error = %v, want one wrapping %v", err, io.ErrUnexpectedEOF)
	}
}

func TestReaderNextCancelled(t *testing.T) {
	r := newReader(newFakeSource())
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := r.Next(ctx)
		errc <- err
	}()
	cancel()
	if err := waitErr(t, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next error = %v, want %v", err, context.Canceled)
	}
}

// waitErr waits for a result, failing the test rather than hanging if none comes.
func waitErr(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(safetyNet):
		t.Fatal("Next did not return after its context was cancelled")
		return nil
	}
}

// openKmsg opens the real /dev/kmsg or skips the test.
func openKmsg(t *testing.T, opts ...Option) *Reader {
	t.Helper()
	r, err := Open(DevKmsg, opts...)
	if err != nil {
		t.Skipf("cannot open %s: %v", DevKmsg, err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// nextWith reads until a record with message msg arrives.
func nextWith(ctx context.Context, t *testing.T, r *Reader, msg string) Record {
	t.Helper()
	for {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("Next while looking for %q: %v", msg, err)
		}
		if rec.Message == msg {
			return rec
		}
	}
}

func TestReaderRealDevice(t *testing.T) {
	tail := openKmsg(t, SeekEnd())
	w, err := os.OpenFile(DevKmsg, os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("cannot write %s: %v", DevKmsg, err)
	}
	marker := fmt.Sprintf("gpuhealth kmsg reader test %d", time.Now().UnixNano())
	_, err = w.WriteString(marker + "\n")
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Skipf("cannot write %s: %v", DevKmsg, err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), safetyNet)
	defer cancel()
	rec := nextWith(ctx, t, tail, marker)
	if rec.Facility != FacilityUser {
		t.Errorf("marker facility = %d, want FacilityUser (%d)", rec.Facility, FacilityUser)
	}
	t.Logf("tail reader: seq=%d level=%d since=%v overruns=%d", rec.Seq, rec.Level, rec.Since, tail.Overruns())

	t.Run("replay from the start finds the marker", func(t *testing.T) {
		replay := openKmsg(t)
		got := nextWith(ctx, t, replay, marker)
		if got.Seq != rec.Seq {
			t.Errorf("replayed marker seq = %d, want %d", got.Seq, rec.Seq)
		}
		t.Logf("replay reader: overruns=%d malformed=%d", replay.Overruns(), replay.Malformed())
	})

	t.Run("cancel with nothing to read", func(t *testing.T) {
		r := openKmsg(t, SeekEnd())
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			// Other processes may log meanwhile; only the error matters.
			for {
				if _, err := r.Next(ctx); err != nil {
					errc <- err
					return
				}
			}
		}()
		cancel()
		if err := waitErr(t, errc); !errors.Is(err, context.Canceled) {
			t.Fatalf("Next error = %v, want %v", err, context.Canceled)
		}
	})
}
