package kmsg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// DevKmsg is the kernel's record-oriented interface to its log buffer.
const DevKmsg = "/dev/kmsg"

// readBufferSize is the kernel's upper bound on one formatted record (CONSOLE_EXT_LOG_MAX);
// a read(2) with a smaller buffer than the next record fails with EINVAL.
const readBufferSize = 8 << 10

// source is what a Reader needs from an open /dev/kmsg; *os.File satisfies it, and tests
// substitute a fake that returns EPIPE.
type source interface {
	io.ReadCloser
	SetReadDeadline(t time.Time) error
}

var _ source = (*os.File)(nil)

// Option configures Open.
type Option func(*options)

type options struct {
	seekEnd bool
}

// SeekEnd makes the reader start after the last record already in the buffer, so that Next
// returns only records logged after Open. Without it a reader replays the buffer from the
// oldest record the kernel still holds.
func SeekEnd() Option {
	return func(o *options) { o.seekEnd = true }
}

// Reader reads records from /dev/kmsg one at a time. Next is not safe for concurrent use;
// Overruns, Malformed and Close are.
type Reader struct {
	src       source
	buf       []byte
	overruns  atomic.Uint64
	malformed atomic.Uint64
}

// Open opens path (normally DevKmsg) for reading. The file is opened non-blocking so that
// Go's poller owns the wait: Next can then be cancelled through a read deadline instead of
// leaving a goroutine stuck in read(2).
func Open(path string, opts ...Option) (*Reader, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open kernel log: %w", err)
	}
	if o.seekEnd {
		// lseek(SEEK_END) on /dev/kmsg positions after the last record (offset is ignored).
		if _, err := f.Seek(0, io.SeekEnd); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("seek to end of kernel log %s: %w", path, err)
		}
	}
	return newReader(f), nil
}

func newReader(src source) *Reader {
	return &Reader{src: src, buf: make([]byte, readBufferSize)}
}

// Next blocks until the next record arrives and returns it, or returns ctx.Err() once ctx
// is done. Records the kernel overwrote before they were read (EPIPE) are counted in
// Overruns, and records that do not parse are counted in Malformed; both are skipped, never
// returned as errors. After Close, Next returns an error wrapping os.ErrClosed.
func (r *Reader) Next(ctx context.Context) (Record, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Record{}, err
		}
		n, err := r.read(ctx)
		switch {
		case err == nil:
		case errors.Is(err, syscall.EPIPE):
			// The kernel moved our position to the oldest record it still holds; the next
			// read continues from there.
			r.overruns.Add(1)
			continue
		case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, syscall.EAGAIN):
			// Nothing to read yet, or ctx fired: the loop head decides.
			continue
		default:
			return Record{}, fmt.Errorf("read kernel log: %w", err)
		}
		rec, err := ParseRecord(string(r.buf[:n]))
		if err != nil {
			r.malformed.Add(1)
			continue
		}
		return rec, nil
	}
}

// read performs one read(2), which on /dev/kmsg returns exactly one record. A cancelled ctx
// interrupts the wait (see cancelable).
func (r *Reader) read(ctx context.Context) (int, error) {
	n, err := cancelable(ctx, r.src, func() (int, error) { return r.src.Read(r.buf) })
	if err == nil && n == 0 {
		return 0, io.EOF
	}
	return n, err
}

// deadliner is a file or connection whose blocking reads a deadline interrupts.
type deadliner interface {
	SetReadDeadline(t time.Time) error
}

// cancelable runs read, which blocks on d, and interrupts it when ctx ends by moving d's read
// deadline into the past: read then fails with os.ErrDeadlineExceeded and no goroutine is left
// stuck in read(2). The deadline is cleared afterwards, so that the next call, with a live
// context, can block again.
func cancelable[T any](ctx context.Context, d deadliner, read func() (T, error)) (T, error) {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = d.SetReadDeadline(time.Unix(1, 0))
	})
	v, err := read()
	if !stop() {
		// The deadline was (or is being) set: wait for it, then clear it.
		<-fired
		_ = d.SetReadDeadline(time.Time{})
	}
	return v, err
}

// Overruns returns how many times the kernel overwrote records before this reader read them.
// Each overrun may have lost any number of records; a gap in Record.Seq tells how many.
func (r *Reader) Overruns() uint64 { return r.overruns.Load() }

// Malformed returns how many records were skipped because they did not parse.
func (r *Reader) Malformed() uint64 { return r.malformed.Load() }

// Close closes the file; a Next blocked in another goroutine returns an error.
func (r *Reader) Close() error { return r.src.Close() }
