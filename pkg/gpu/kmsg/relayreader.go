package kmsg

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

// relayGreetingTimeout bounds connecting to a relay and reading its greeting.
const relayGreetingTimeout = 5 * time.Second

// RelayReader reads the records a [Relay] hands out, as [Reader] reads /dev/kmsg: Next is not
// safe for concurrent use; Overruns, Malformed, Lost and Close are.
type RelayReader struct {
	conn net.Conn
	in   *bufio.Reader
	// line holds the part of a line read before a read was interrupted; discarding is set
	// while the rest of a line too long to keep is skipped.
	line       []byte
	discarding bool
	// lastSeq is the sequence number of the last record returned: the relay sends each
	// record once and in order, so one at or before it breaks the protocol.
	lastSeq uint64
	haveSeq bool

	overruns, lost, malformed atomic.Uint64
}

var _ records = (*RelayReader)(nil)

// DialRelay connects to the relay listening on socket and reads its greeting. A relay that
// cannot serve (it could not open the kernel log) fails with ErrRelayRefused and the relay's
// reason; one that does not answer with ErrRelayUnreachable. bootID, when the relay and the
// caller both know theirs, must be the relay's: the sequence numbers, and so the caller's
// cursor, are those of one boot.
func DialRelay(socket, bootID string) (*RelayReader, error) {
	conn, err := net.DialTimeout("unix", socket, relayGreetingTimeout)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %w", ErrRelayUnreachable, socket, err)
	}
	r := &RelayReader{conn: conn, in: bufio.NewReaderSize(conn, maxRelayLine)}
	_ = conn.SetReadDeadline(time.Now().Add(relayGreetingTimeout))
	line, err := r.readLine()
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("%w at %s: no greeting: %w", ErrRelayUnreachable, socket, err)
	}
	boot, err := parseGreeting(string(line))
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if boot != "" && bootID != "" && boot != bootID {
		_ = conn.Close()
		return nil, fmt.Errorf("%w: the relay at %s reads the log of boot %s, this is boot %s", ErrRelayRefused, socket, boot, bootID)
	}
	return r, nil
}

// Next blocks until the relay sends the next record and returns it, or returns ctx.Err() once
// ctx is done. Overrun lines are counted (Overruns, Lost); lines that do not parse, and records
// out of order, are counted in Malformed and skipped. The relay hanging up is an error.
func (r *RelayReader) Next(ctx context.Context) (Record, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Record{}, err
		}
		line, err := cancelable(ctx, r.conn, r.readLine)
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue // ctx fired: the loop head returns
		case errors.Is(err, io.EOF):
			return Record{}, fmt.Errorf("read kernel log: the kmsg relay hung up: %w", err)
		default:
			return Record{}, fmt.Errorf("read kernel log from the kmsg relay: %w", err)
		}
		if rec, ok := r.parse(line); ok {
			return rec, nil
		}
	}
}

// parse reads one line of the relay: a record it returns, an overrun it counts, anything else
// it counts as malformed.
func (r *RelayReader) parse(line []byte) (Record, bool) {
	switch {
	case bytes.HasPrefix(line, []byte(relayRecordTag)):
		rec, err := ParseRecord(string(line[len(relayRecordTag):]))
		if err != nil || r.haveSeq && rec.Seq <= r.lastSeq {
			r.malformed.Add(1)
			return Record{}, false
		}
		r.lastSeq, r.haveSeq = rec.Seq, true
		return rec, true
	case bytes.HasPrefix(line, []byte(relayOverrunTag)):
		n, err := strconv.ParseUint(string(line[len(relayOverrunTag):]), 10, 64)
		if err != nil {
			r.malformed.Add(1)
			return Record{}, false
		}
		r.lost.Add(n)
		r.overruns.Add(1)
		return Record{}, false
	}
	r.malformed.Add(1)
	return Record{}, false
}

// readLine returns the next line without its newline. A read interrupted by a deadline keeps
// what it read for the next call; a line longer than maxRelayLine is skipped and counted.
func (r *RelayReader) readLine() ([]byte, error) {
	for {
		frag, err := r.in.ReadSlice('\n')
		if !r.discarding {
			if len(r.line)+len(frag) > maxRelayLine {
				r.discarding, r.line = true, r.line[:0]
			} else {
				r.line = append(r.line, frag...)
			}
		}
		switch {
		case err == nil:
			if r.discarding {
				r.discarding = false
				r.malformed.Add(1)
				continue
			}
			line := bytes.Clone(bytes.TrimSuffix(r.line, []byte{'\n'}))
			r.line = r.line[:0]
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// Overruns returns how many times the relay said records were lost.
func (r *RelayReader) Overruns() uint64 { return r.overruns.Load() }

// Lost returns how many records those overruns lost, as the relay counted them.
func (r *RelayReader) Lost() uint64 { return r.lost.Load() }

// Malformed returns how many lines were skipped because they did not parse or broke the order.
func (r *RelayReader) Malformed() uint64 { return r.malformed.Load() }

// Close hangs up; a Next blocked in another goroutine returns an error.
func (r *RelayReader) Close() error { return r.conn.Close() }
