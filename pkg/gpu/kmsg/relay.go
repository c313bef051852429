package kmsg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// The relay protocol, version 1. A Relay speaks it over a Unix stream socket to its clients; a
// client sends nothing. Each line ends in '\n' and holds no other newline (a record's message
// is escaped as /dev/kmsg escapes it):
//
//	gpuhealth-kmsg-relay/1 boot=<boot ID>   greeting: the relay reads the log of this boot
//	gpuhealth-kmsg-relay/1 error <text>     greeting and only line: it cannot serve, and why
//	r <record>                              one record as /dev/kmsg formats it, with its
//	                                        sequence number, dictionary left out
//	o <n>                                   records were lost here: n the kernel overwrote
//	                                        before the relay read them, or n lines the client
//	                                        fell behind the relay's buffer
//
// A reader skips lines of any other kind (counted as malformed), so that a later version may
// add some. The sequence numbers and the boot ID are what a reader dedupes by: a client that
// connects again, after either side restarted, gets everything the relay holds and skips what
// its cursor says it applied.
const (
	relayProtocol    = "gpuhealth-kmsg-relay/1"
	relayRecordTag   = "r "
	relayOverrunTag  = "o "
	relayErrorPrefix = relayProtocol + " error "
	relayBootPrefix  = relayProtocol + " boot="
	// maxRelayLine bounds one line: a record is at most readBufferSize as the kernel formats it.
	maxRelayLine = readBufferSize + 64
)

// Relay defaults.
const (
	// DefaultRelayBufferBytes bounds the text of the records a Relay holds for clients that
	// connect later: thousands of driver lines, a few times what a kernel's whole buffer
	// usually holds of them.
	DefaultRelayBufferBytes = 1 << 20
	// DefaultRelayMaxClients bounds the connections a Relay serves at once (the agent, the
	// device plugin, a probe or two).
	DefaultRelayMaxClients = 8
	// DefaultRelayWriteTimeout is how long a client may leave a write unread before it is
	// disconnected; it reconnects and skips what it has applied.
	DefaultRelayWriteTimeout = 10 * time.Second
)

// relayBatchLines bounds the lines one write carries.
const relayBatchLines = 256

// RelayOptions configure a Relay.
type RelayOptions struct {
	// BootID names the boot whose log the relay reads; clients check it is theirs.
	BootID string
	// MaxBytes bounds the records held (their text); 0 means DefaultRelayBufferBytes. The
	// oldest go first.
	MaxBytes int
	// MaxClients bounds the clients served at once; 0 means DefaultRelayMaxClients. Another
	// client gets an error greeting.
	MaxClients int
	// WriteTimeout bounds one write to a client; 0 means DefaultRelayWriteTimeout.
	WriteTimeout time.Duration
}

// Relay hands the NVIDIA driver's kernel-log records to processes that cannot open /dev/kmsg
// themselves: a container runtime lets only a privileged container open it, and the relay is
// all that needs to run there. [Relay.Read] keeps the records the kernel wrote (kernel
// facility) whose message holds "NVRM:", and nothing else, in a buffer bounded by
// RelayOptions.MaxBytes; [Relay.Serve] sends every client, on connecting, all it holds and then
// each new record. Lines a process wrote to the log are counted and dropped: they can neither
// reach a client nor push the driver's records out of the buffer. Clients read with
// [DialRelay] (or [OpenSource] with SourceOptions.RelaySocket).
type Relay struct {
	opts  RelayOptions
	slots chan struct{}

	mu sync.Mutex
	// held are the lines kept for clients, oldest first; first is the index of held[0] among
	// every line ever added, bytes their length.
	held  []string
	first uint64
	bytes int
	// grew is closed, and replaced, when a line is added.
	grew chan struct{}
	// failure, when set, is why the relay cannot serve; clients get it as their greeting.
	failure string

	records, forwarded, spoofed, overruns atomic.Uint64
}

// RelayStats counts what a Relay read.
type RelayStats struct {
	// Records is every record read, Forwarded the driver's records kept for clients, Spoofed
	// the NVRM lines a process wrote, Overruns the times the kernel overwrote records before
	// they were read.
	Records, Forwarded, Spoofed, Overruns uint64
}

// NewRelay returns a Relay holding nothing yet.
func NewRelay(opts RelayOptions) *Relay {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultRelayBufferBytes
	}
	if opts.MaxClients <= 0 {
		opts.MaxClients = DefaultRelayMaxClients
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultRelayWriteTimeout
	}
	return &Relay{opts: opts, slots: make(chan struct{}, opts.MaxClients), grew: make(chan struct{})}
}

// Stats returns the counts so far; safe to call while the relay runs.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Records: r.records.Load(), Forwarded: r.forwarded.Load(), Spoofed: r.spoofed.Load(), Overruns: r.overruns.Load()}
}

// Fail makes every client from now on get reason, and nothing else: the relay could not open
// the log (the reason says why, and its hint how to fix it), so that the clients can say so
// instead of finding no relay.
func (r *Relay) Fail(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failure = strings.ReplaceAll(reason, "\n", " ")
}

// Read reads in until ctx ends (then it returns nil) or in fails, keeping the driver's
// records for the clients. The caller closes in.
func (r *Relay) Read(ctx context.Context, in *Reader) error { return r.read(ctx, in) }

func (r *Relay) read(ctx context.Context, in records) error {
	logger := logr.FromContextOrDiscard(ctx)
	var overruns, lastSeq uint64
	haveSeq := false
	for {
		rec, err := in.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		r.records.Add(1)
		if n := in.Overruns(); n != overruns {
			overruns = n
			lost := uint64(0)
			if haveSeq && rec.Seq > lastSeq+1 {
				lost = rec.Seq - lastSeq - 1
			}
			r.overruns.Add(1)
			r.add(relayOverrunTag + strconv.FormatUint(lost, 10))
			logger.Info("The kernel overwrote log records before the relay read them", "lost", lost, "overruns", n)
		}
		lastSeq, haveSeq = rec.Seq, true
		if !strings.Contains(rec.Message, "NVRM:") {
			continue
		}
		if rec.Facility != FacilityKernel {
			if n := r.spoofed.Add(1); sparse(n) {
				logger.Info("Ignoring an NVRM line that a process, not the kernel, wrote to the log", "facility", rec.Facility, "seq", rec.Seq, "count", n)
			}
			continue
		}
		rec.Dict = nil
		r.forwarded.Add(1)
		r.add(relayRecordTag + rec.String())
	}
}

// add keeps line for the clients, dropping the oldest lines past the bound, and wakes the
// clients waiting for it.
func (r *Relay) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = append(r.held, line)
	r.bytes += len(line)
	for r.bytes > r.opts.MaxBytes && len(r.held) > 1 {
		r.bytes -= len(r.held[0])
		r.held[0] = ""
		r.held = r.held[1:]
		r.first++
	}
	close(r.grew)
	r.grew = make(chan struct{})
}

// since returns the lines held from index next on (at most relayBatchLines), how many lines
// before them the client missed because they were dropped, the index after them, and a
// channel closed when another line is added.
func (r *Relay) since(next uint64) (lines []string, lost, after uint64, grew <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if next < r.first {
		lost, next = r.first-next, r.first
	}
	from := int(next - r.first)
	to := min(len(r.held), from+relayBatchLines)
	return append([]string(nil), r.held[from:to]...), lost, next + uint64(to-from), r.grew
}

// oldest returns the index of the oldest line held.
func (r *Relay) oldest() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first
}

func (r *Relay) greeting() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failure != "" {
		return relayErrorPrefix + r.failure
	}
	return relayBootPrefix + r.opts.BootID
}

// Serve accepts clients on ln until ctx ends (then it closes ln, waits for its clients and
// returns nil) or accepting fails.
func (r *Relay) Serve(ctx context.Context, ln net.Listener) error {
	logger := logr.FromContextOrDiscard(ctx)
	var clients sync.WaitGroup
	defer clients.Wait()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("kmsg relay: accept: %w", err)
		}
		select {
		case r.slots <- struct{}{}:
		default:
			logger.Info("Refusing a client: too many connected", "max", r.opts.MaxClients)
			r.refuse(conn, fmt.Sprintf("too many clients (%d)", r.opts.MaxClients))
			continue
		}
		clients.Go(func() {
			defer func() { <-r.slots }()
			r.serve(ctx, conn)
		})
	}
}

func (r *Relay) refuse(conn net.Conn, reason string) {
	_ = conn.SetWriteDeadline(time.Now().Add(r.opts.WriteTimeout))
	_, _ = conn.Write([]byte(relayErrorPrefix + reason + "\n"))
	_ = conn.Close()
}

// serve sends one client the greeting, every line held, then each new one, until ctx ends, the
// client hangs up or sends anything, or a write fails or times out.
func (r *Relay) serve(ctx context.Context, conn net.Conn) {
	logger := logr.FromContextOrDiscard(ctx)
	ctx, cancel := context.WithCancel(ctx)
	var hangup sync.WaitGroup
	defer hangup.Wait()
	defer conn.Close()
	defer cancel()
	// A client sends nothing: its first byte, or its hanging up, ends the connection, so that
	// a client gone quiet does not hold its slot until the next record.
	hangup.Go(func() {
		defer cancel()
		_, _ = conn.Read(make([]byte, 1))
	})
	write := func(b []byte) bool {
		_ = conn.SetWriteDeadline(time.Now().Add(r.opts.WriteTimeout))
		if _, err := conn.Write(b); err != nil {
			if ctx.Err() == nil {
				logger.Info("Disconnecting a client that does not read", "err", err.Error())
			}
			return false
		}
		return true
	}
	greeting := r.greeting()
	if !write([]byte(greeting+"\n")) || strings.HasPrefix(greeting, relayErrorPrefix) {
		return
	}
	// A client starts at the oldest line held, as a reader of /dev/kmsg starts at the oldest
	// record the kernel holds: what went before is no loss of its own.
	next := r.oldest()
	var buf []byte
	for {
		lines, lost, after, grew := r.since(next)
		next = after
		buf = buf[:0]
		if lost > 0 {
			buf = append(buf, relayOverrunTag...)
			buf = strconv.AppendUint(buf, lost, 10)
			buf = append(buf, '\n')
		}
		for _, l := range lines {
			buf = append(buf, l...)
			buf = append(buf, '\n')
		}
		if len(buf) > 0 {
			if !write(buf) {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-grew:
		}
	}
}

// ErrRelayUnreachable is wrapped by the errors of a relay that does not answer: no socket, no
// one listening, no greeting.
var ErrRelayUnreachable = errors.New("the kmsg relay does not answer")

// ErrRelayRefused is wrapped by the error of a relay that answered but cannot serve: its
// greeting says why (it could not open the kernel log, or serves too many clients).
var ErrRelayRefused = errors.New("the kmsg relay cannot serve")

// parseGreeting returns the boot ID a relay's greeting names, or why it cannot serve.
func parseGreeting(line string) (string, error) {
	if reason, ok := strings.CutPrefix(line, relayErrorPrefix); ok {
		return "", fmt.Errorf("%w: %s", ErrRelayRefused, reason)
	}
	boot, ok := strings.CutPrefix(line, relayBootPrefix)
	if !ok {
		return "", fmt.Errorf("%w: greeting %.80q is not %s's", ErrRelayUnreachable, line, relayProtocol)
	}
	return boot, nil
}
