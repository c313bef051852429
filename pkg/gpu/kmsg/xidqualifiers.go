package kmsg

import (
	"strconv"
	"strings"
)

// Severity is how the driver classed an error on the line itself.
type Severity uint8

const (
	// SeverityUnknown: the line does not say.
	SeverityUnknown Severity = iota
	// SeverityNonfatal: "Nonfatal"; the GPU keeps working.
	SeverityNonfatal
	// SeverityFatal: "Fatal" (NVLink5), or XID 74's "fatal error detected on link".
	SeverityFatal
)

func (s Severity) String() string {
	switch s {
	case SeverityUnknown:
		return "Unknown"
	case SeverityNonfatal:
		return "Nonfatal"
	case SeverityFatal:
		return "Fatal"
	}
	return "Severity(" + strconv.Itoa(int(s)) + ")"
}

// NoLink is NVLinkError.Link for a line that names no particular link: the driver itself writes
// "Link -1" for an error of the whole NVLink block.
const NoLink = -1

// NVLinkError is what an NVLink XID line says beside its code. Two forms carry it:
//
//	145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 ...)   NVLink5, XIDs 144-150 (R570+)
//	74, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, ...)     XID 74 (Ampere, Hopper)
//
// Both are GPU firmware messages the kernel module prints as they come, so nothing here is
// trusted beyond its shape: a part that cannot be read is left at its zero value (NoLink for
// the link) and the XID still counts.
type NVLinkError struct {
	// Unit is the hardware unit the driver named, as written ("RLW_RXPIPE", "NETIR_LINK_EVT",
	// "TLW_RX/TLW_RX_PIPE0"); empty for XID 74, which names none.
	Unit string
	// Severity is the driver's class of the error; SeverityUnknown when the line has none that
	// this parser knows.
	Severity Severity
	// Link is the NVLink number as written ("Link 08" is 8), or NoLink when the line names no
	// link or a number that cannot be one.
	Link int
}

// parseNVLink returns the NVLink qualifiers at the start of an XID's detail (what follows the
// code and any pid and name), or nil when the detail has neither form.
//
// NVLink5: "<unit> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<hex> ...)"; the words may be separated
// by more than one space ("NETIR_LINK_EVT  Fatal   XC0"). The unit, the severity and a word
// starting "XC" must be there; the link is searched for up to the register list.
func parseNVLink(detail string) *NVLinkError {
	if rest, ok := strings.CutPrefix(detail, "NVLink: "); ok {
		return parseXid74(rest)
	}
	unit, rest := nextWord(detail)
	sevWord, rest := nextWord(rest)
	var sev Severity
	switch sevWord {
	case "Fatal":
		sev = SeverityFatal
	case "Nonfatal":
		sev = SeverityNonfatal
	default:
		return nil
	}
	xc, rest := nextWord(rest)
	if unit == "" || !strings.HasPrefix(xc, "XC") {
		return nil
	}
	nv := &NVLinkError{Unit: unit, Severity: sev, Link: NoLink}
	for {
		var w string
		w, rest = nextWord(rest)
		if w == "" || strings.HasPrefix(w, "(") {
			return nv
		}
		if w == "Link" {
			n, _ := nextWord(rest)
			nv.Link = parseLink(n)
			return nv
		}
	}
}

// parseXid74 parses what follows "NVLink: " in XID 74: "fatal error detected on link 14(0x0,
// ...)". Only "fatal" has been seen; another word leaves the severity unknown but keeps the link.
func parseXid74(s string) *NVLinkError {
	word, rest, ok := strings.Cut(s, " error detected on link ")
	if !ok {
		return nil
	}
	nv := &NVLinkError{Link: parseLink(rest)}
	if word == "fatal" {
		nv.Severity = SeverityFatal
	}
	return nv
}

// parseLink reads the link number at the start of s ("13", "08", "-1", "14(0x0,"): NoLink when
// there is none or it cannot be a link.
func parseLink(s string) int {
	neg := strings.HasPrefix(s, "-")
	digits := strings.TrimPrefix(s, "-")
	digits = digits[:len(digits)-len(strings.TrimLeft(digits, "0123456789"))]
	if neg || digits == "" {
		return NoLink
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return NoLink
	}
	return n
}

// nextWord returns the first space-separated word of s and what follows it; it allocates
// nothing, unlike strings.Fields.
func nextWord(s string) (word, rest string) {
	s = strings.TrimLeft(s, " ")
	if i := strings.IndexByte(s, ' '); i >= 0 {
		return s[:i], s[i:]
	}
	return s, ""
}

// causedByPrevious is what the driver appends to XID 45 (preemptive cleanup) when an earlier XID
// made it remove the channel, since R570.124: "... Ch 00000001 caused by previous Xid 149"
// (kernel_rc.c in NVIDIA/open-gpu-kernel-modules).
const causedByPrevious = "caused by previous Xid "

// parseCausedBy returns the XID a detail names as its cause, or 0.
func parseCausedBy(detail string) int {
	i := strings.LastIndex(detail, causedByPrevious)
	if i < 0 {
		return 0
	}
	s := detail[i+len(causedByPrevious):]
	digits := s[:len(s)-len(strings.TrimLeft(s, "0123456789"))]
	if digits == "" {
		return 0
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
