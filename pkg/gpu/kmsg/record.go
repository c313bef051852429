package kmsg

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Facility is the syslog facility of a record: the high bits of its priority.
type Facility uint8

// The facilities that matter here; the kernel writes FacilityKernel, and a process writing to
// /dev/kmsg gets FacilityUser unless it sets one itself.
const (
	FacilityKernel Facility = 0
	FacilityUser   Facility = 1
)

// Level is the syslog severity of a record: the low three bits of its priority.
type Level uint8

// Syslog levels, most severe first, as the kernel's KERN_* constants.
const (
	LevelEmerg Level = iota
	LevelAlert
	LevelCrit
	LevelErr
	LevelWarning
	LevelNotice
	LevelInfo
	LevelDebug
)

// maxPriority bounds the priority field so that the facility fits a Facility.
const maxPriority = math.MaxUint8<<3 | 7

// Record is one kernel log record as read from /dev/kmsg.
type Record struct {
	Facility Facility
	Level    Level
	// Seq is the record's sequence number; a gap between two reads means records were
	// overwritten before they were read.
	Seq uint64
	// Since is the time since boot at which the record was logged (monotonic clock).
	Since time.Duration
	// Flags is the raw flags field: "-" for a record, "c" (older kernels) for a fragment
	// that continues in the next record.
	Flags string
	// Message is the record's text with the kernel's \xNN escapes undone; it may hold
	// newlines when the driver logged several lines with one call.
	Message string
	// Dict holds the key=value lines that follow the record (SUBSYSTEM=pci,
	// DEVICE=+pci:0000:3b:00.0); nil when there are none.
	Dict map[string]string
}

// ErrMalformed is wrapped by every error ParseRecord returns.
var ErrMalformed = errors.New("malformed kmsg record")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// ParseRecord parses one record read from /dev/kmsg:
//
//	priority,seq,usec,flags[,more fields];message
//	 KEY=value
//
// A read of /dev/kmsg returns exactly one record, its dictionary lines (each starting with a
// space) included; a trailing newline is optional. Fields after flags are ignored, as the ABI
// asks, so that later kernels may add them.
func ParseRecord(line string) (Record, error) {
	line = strings.TrimSuffix(line, "\n")
	head, dict, _ := strings.Cut(line, "\n")
	prefix, msg, ok := strings.Cut(head, ";")
	if !ok {
		return Record{}, malformed("no ';' between prefix and message")
	}
	// The fields are cut one by one rather than split: a record costs no slice.
	prioField, rest, ok1 := strings.Cut(prefix, ",")
	seqField, rest, ok2 := strings.Cut(rest, ",")
	usecField, rest, ok3 := strings.Cut(rest, ",")
	flags, _, _ := strings.Cut(rest, ",")
	if !ok1 || !ok2 || !ok3 {
		return Record{}, malformed("prefix %q has %d fields, want at least 4 (priority,seq,usec,flags)", prefix, strings.Count(prefix, ",")+1)
	}
	prio, err := strconv.ParseUint(prioField, 10, 16)
	if err != nil || prio > maxPriority {
		return Record{}, malformed("priority %q is not a number in [0,%d]", prioField, maxPriority)
	}
	seq, err := strconv.ParseUint(seqField, 10, 64)
	if err != nil {
		return Record{}, malformed("sequence number %q: %v", seqField, err)
	}
	usec, err := strconv.ParseUint(usecField, 10, 64)
	if err != nil || usec > uint64(math.MaxInt64/int64(time.Microsecond)) {
		return Record{}, malformed("timestamp %q is not a number of microseconds", usecField)
	}
	if flags == "" {
		return Record{}, malformed("empty flags field")
	}
	r := Record{
		Facility: Facility(prio >> 3),
		Level:    Level(prio & 7),
		Seq:      seq,
		Since:    time.Duration(usec) * time.Microsecond,
		Flags:    flags,
		Message:  unescape(msg),
	}
	if dict == "" {
		return r, nil
	}
	for kv := range strings.SplitSeq(dict, "\n") {
		rest, ok := strings.CutPrefix(kv, " ")
		if !ok {
			return Record{}, malformed("line %q after the message is not a dictionary line (those start with a space)", kv)
		}
		k, v, ok := strings.Cut(rest, "=")
		if !ok || k == "" {
			return Record{}, malformed("dictionary line %q is not KEY=value", kv)
		}
		if r.Dict == nil {
			r.Dict = make(map[string]string)
		}
		r.Dict[k] = unescape(v)
	}
	return r, nil
}

// String formats r the way /dev/kmsg does, escapes included, without a trailing newline:
// ParseRecord(r.String()) gives r back for any record ParseRecord returned.
func (r Record) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d,%d,%d,%s;", uint(r.Facility)<<3|uint(r.Level&7), r.Seq, r.Since.Microseconds(), r.Flags)
	escape(&b, r.Message)
	keys := make([]string, 0, len(r.Dict))
	for k := range r.Dict {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteString("\n ")
		b.WriteString(k)
		b.WriteByte('=')
		escape(&b, r.Dict[k])
	}
	return b.String()
}

// unescape undoes the kernel's escaping: it writes every byte below 0x20, every byte from
// 0x7f up and the backslash itself as \xNN. A backslash not followed by x and two hex digits
// is kept as it is rather than rejected: the record is still worth reading.
func unescape(s string) string {
	if !strings.Contains(s, `\x`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' {
			if hi, ok := unhex(s[i+2]); ok {
				if lo, ok := unhex(s[i+3]); ok {
					b.WriteByte(hi<<4 | lo)
					i += 3
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// escape writes s escaped as the kernel does (see unescape).
func escape(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < ' ' || c >= 0x7f || c == '\\' {
			b.WriteString(`\x`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
}
