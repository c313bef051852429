package kmsg

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// SourceName names the kernel log among a Monitor's replayable sources and in metrics.
const SourceName = "kmsg"

// ReplaySink is what a Source feeds; *health.Monitor satisfies it. It is not a gpu.Sink, nor a
// capability of one: a replayable source applies signals only together with its cursor, one
// record at a time, and reads the cursor back at start, so it needs both methods and nothing
// of gpu.Sink.
type ReplaySink interface {
	// Cursor returns how far the source's records were applied, as restored from the checkpoint.
	Cursor(source string) (health.Cursor, bool)
	// Advance applies the signals of one record and moves the cursor past it, atomically for
	// the checkpoint.
	Advance(source string, to health.Cursor, sigs ...health.Signal)
}

var _ ReplaySink = (*health.Monitor)(nil)

// SourceOptions configure a Source.
type SourceOptions struct {
	// Path is the kernel log device; empty means DevKmsg.
	Path string
	// RelaySocket, when set, is where a Relay listens: the log is read from it, not from Path
	// (for a process that may not open the device; see Relay).
	RelaySocket string
	// BootID names the current boot (health.ReadBootID). Sequence numbers restart at every boot,
	// so a cursor of another boot is ignored and the whole buffer is replayed.
	BootID string
	// Dedup, when set, drops XIDs that NVML already reported (see health.Dedup).
	Dedup *health.Dedup
	// clock returns the wall time and the kernel's time since boot, read together; nil reads
	// the real clocks. Tests replace it.
	clock func() (time.Time, time.Duration)
}

// records is what a Source reads; *Reader satisfies it, and benchmarks substitute records held
// in memory.
type records interface {
	Next(ctx context.Context) (Record, error)
	Overruns() uint64
	Malformed() uint64
	Close() error
}

var _ records = (*Reader)(nil)

// lostCounter is a records source that knows how many records its overruns lost, as the relay
// says; for /dev/kmsg itself the gap in sequence numbers tells.
type lostCounter interface {
	Lost() uint64
}

var _ lostCounter = (*RelayReader)(nil)

// Source turns the kernel log into health signals: at Run it replays every record the kernel
// still holds, skipping those its cursor says were applied in this boot, then follows new
// records. Only records of the kernel facility count; an NVRM line written by a process is
// counted as spoofed and ignored.
type Source struct {
	opts   SourceOptions
	in     records
	mapper *Mapper
	stats  sourceStats
}

// Stats counts what a Source read.
type Stats struct {
	// Records is every record read, Signals every signal applied.
	Records, Signals uint64
	// AlreadyApplied counts records of the replay that the checkpoint's cursor says were
	// applied before a restart.
	AlreadyApplied uint64
	// Spoofed counts NVRM lines that a process, not the kernel, wrote.
	Spoofed uint64
	// Malformed counts records that did not parse; Overruns the times the kernel overwrote
	// records before they were read (each may lose several).
	Malformed, Overruns uint64
	// UnknownDevice counts events about a GPU the inventory lacks; BadXID events whose code
	// cannot be an XID.
	UnknownDevice, BadXID uint64
	// Duplicates counts XIDs dropped because NVML had reported them.
	Duplicates uint64
}

type sourceStats struct {
	records, signals, alreadyApplied, spoofed, unknownDevice, badXID, duplicates atomic.Uint64
}

// OpenSource opens the kernel log (from its oldest record) for the GPUs in devices. It fails
// when the log cannot be read: no such device, or no permission (reading /dev/kmsg needs
// CAP_SYSLOG unless the sysctl kernel.dmesg_restrict is 0). With opts.RelaySocket it connects
// to that Relay instead, and fails when the relay does not answer or cannot read the log.
func OpenSource(devices []health.Device, opts SourceOptions) (*Source, error) {
	if opts.RelaySocket != "" {
		r, err := DialRelay(opts.RelaySocket, opts.BootID)
		if err != nil {
			return nil, err
		}
		return newSource(r, devices, opts), nil
	}
	if opts.Path == "" {
		opts.Path = DevKmsg
	}
	r, err := Open(opts.Path)
	if err != nil {
		return nil, err
	}
	return newSource(r, devices, opts), nil
}

func newSource(in records, devices []health.Device, opts SourceOptions) *Source {
	if opts.clock == nil {
		opts.clock = bootClock
	}
	return &Source{opts: opts, in: in, mapper: NewMapper(devices)}
}

// Close closes the kernel log; a Run in progress returns.
func (s *Source) Close() error { return s.in.Close() }

// Stats returns the counts so far; safe to call while Run runs.
func (s *Source) Stats() Stats {
	return Stats{
		Records: s.stats.records.Load(), Signals: s.stats.signals.Load(), AlreadyApplied: s.stats.alreadyApplied.Load(),
		Spoofed: s.stats.spoofed.Load(), Malformed: s.in.Malformed(), Overruns: s.in.Overruns(),
		UnknownDevice: s.stats.unknownDevice.Load(), BadXID: s.stats.badXID.Load(), Duplicates: s.stats.duplicates.Load(),
	}
}

// Run reads records until ctx is done (then it returns nil) or the log fails to read. Bad
// records, spoofed lines, unknown GPUs and overruns are counted and logged (ctx's logr logger,
// sparingly: a flood of them logs O(log n) lines), never fatal.
func (s *Source) Run(ctx context.Context, sink ReplaySink) error {
	logger := logr.FromContextOrDiscard(ctx).WithValues("source", SourceName)
	from, ok := sink.Cursor(SourceName)
	resume := ok && from.BootID == s.opts.BootID && s.opts.BootID != ""
	if resume {
		logger.Info("Replaying the kernel log after the last record applied", "seq", from.Seq)
	} else {
		logger.Info("Replaying the kernel log since boot")
	}
	var (
		sigs           []health.Signal
		overruns, lost uint64
		lastSeq        uint64
		haveSeq        bool
	)
	counter, relayed := s.in.(lostCounter)
	for {
		rec, err := s.in.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		s.stats.records.Add(1)
		if n := s.in.Overruns(); n != overruns {
			overruns = n
			var gone uint64
			switch {
			case relayed:
				// The relay passes on only the driver's records: a gap in their sequence
				// numbers is every other record, so the relay counts what was lost.
				gone = counter.Lost() - lost
				lost += gone
			case haveSeq && rec.Seq > lastSeq+1:
				gone = rec.Seq - lastSeq - 1
			}
			logger.Info("The kernel overwrote log records before they were read", "lost", gone, "overruns", n)
		}
		lastSeq, haveSeq = rec.Seq, true
		if !strings.Contains(rec.Message, "NVRM:") {
			continue
		}
		if rec.Facility != FacilityKernel {
			if n := s.stats.spoofed.Add(1); sparse(n) {
				logger.Info("Ignoring an NVRM line that a process, not the kernel, wrote to the log", "facility", rec.Facility, "seq", rec.Seq, "count", n)
			}
			continue
		}
		ev, ok := ParseNVRM(rec.Message)
		if !ok {
			continue // an NVRM line that reports nothing about health (banners, notes)
		}
		sigs, err = s.mapper.Signals(ev, s.wallTime(rec.Since), sigs[:0])
		switch {
		case errors.Is(err, ErrUnknownDevice):
			if n := s.stats.unknownDevice.Add(1); sparse(n) {
				logger.Info("Ignoring an NVRM line about a GPU this node's inventory lacks", "pci", ev.PCIBusID, "uuid", ev.UUID, "kind", ev.Kind, "count", n)
			}
			continue
		case errors.Is(err, ErrBadXID):
			if n := s.stats.badXID.Add(1); sparse(n) {
				logger.Info("Ignoring an XID line with an impossible code", "xid", ev.Xid, "seq", rec.Seq, "count", n)
			}
			continue
		case err != nil:
			return fmt.Errorf("kernel log record %d: %w", rec.Seq, err) // unreachable: Signals returns no other error
		}
		if len(sigs) == 0 {
			continue // an identity line: the Mapper learnt an address
		}
		if resume && rec.Seq <= from.Seq {
			s.stats.alreadyApplied.Add(1)
			continue
		}
		kept := sigs[:0]
		for _, sig := range sigs {
			if s.opts.Dedup != nil && !s.opts.Dedup.Admit(SourceName, sig) {
				s.stats.duplicates.Add(1)
				continue
			}
			kept = append(kept, sig)
		}
		s.stats.signals.Add(uint64(len(kept)))
		logger.V(1).Info("NVRM event", "seq", rec.Seq, "kind", ev.Kind, "pci", ev.PCIBusID, "xid", ev.Xid, "signals", len(kept))
		sink.Advance(SourceName, health.Cursor{BootID: s.opts.BootID, Seq: rec.Seq}, kept...)
	}
}

// wallTime converts a record's time since boot into wall time (see bootClock). The offset
// between the wall clock and the time since boot is read afresh for each record, as both are
// adjusted while the node runs; a record is never placed after the moment it was read.
func (s *Source) wallTime(since time.Duration) time.Time {
	now, up := s.opts.clock()
	t := now.Add(since - up)
	if t.After(now) {
		return now
	}
	return t
}

// sparse reports whether the n-th occurrence of something is worth a log line: the first, then
// each power of two.
func sparse(n uint64) bool { return bits.OnesCount64(n) == 1 }
