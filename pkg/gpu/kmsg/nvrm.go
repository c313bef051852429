package kmsg

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Kind says what an NVRM line reports.
type Kind int

const (
	// KindXid is an XID error: "NVRM: Xid (PCI:0000:3b:00): 79, ...".
	KindXid Kind = iota + 1
	// KindInitFailed is a GPU the driver could not initialise:
	// "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x22:0x56:894)". NVML cannot open it.
	KindInitFailed
	// KindLost is a GPU that fell off the bus, reported without an XID.
	KindLost
	// KindIdentity maps a PCI bus ID to a GPU UUID:
	// "NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375". The driver logs it
	// just before the first XID of a GPU, which lets a reader name the GPU by UUID.
	KindIdentity
)

func (k Kind) String() string {
	switch k {
	case KindXid:
		return "Xid"
	case KindInitFailed:
		return "InitFailed"
	case KindLost:
		return "Lost"
	case KindIdentity:
		return "Identity"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// RecoveryAction is the action the driver asks for in XID 154; the values are NVML's
// nvmlDeviceGpuRecoveryAction_t.
type RecoveryAction uint32

// Recovery actions as NVML numbers them.
const (
	RecoveryNone          RecoveryAction = 0
	RecoveryGPUReset      RecoveryAction = 1
	RecoveryNodeReboot    RecoveryAction = 2
	RecoveryDrainP2P      RecoveryAction = 3
	RecoveryDrainAndReset RecoveryAction = 4
)

// MIGScope is the MIG instance an XID was attributed to.
type MIGScope struct {
	GPUInstance int
	// ComputeInstance is -1 when the line names only the GPU instance.
	ComputeInstance int
}

// Event is what one NVRM line says about one GPU.
type Event struct {
	Kind Kind
	// PCIBusID is the GPU's address in the form 0000:3b:00.0 (see NormalizeBusID). It is
	// empty only for an XID whose address the driver wrote in a form too old to read.
	PCIBusID string
	// Xid is the XID code; set for KindXid only.
	Xid int
	// PID and Process name the process the driver blamed; 0 and "" when the line has none
	// or says <unknown>.
	PID     int
	Process string
	// MIG is the MIG instance named by the line; nil for the whole GPU.
	MIG *MIGScope
	// RecoveryAction is the new action of an XID 154 line; nil otherwise.
	RecoveryAction *RecoveryAction
	// NVLink is what an NVLink XID line says about the fault beside its code: the unit, the
	// driver's severity and the link (see NVLinkError); nil for lines that say none of it.
	NVLink *NVLinkError
	// CausedByXid is the earlier XID the driver names as this one's cause, 149 in "45, pid=...,
	// name=..., Ch 00000001 caused by previous Xid 149"; 0 when the line names none.
	CausedByXid int
	// UUID is the GPU's UUID ("GPU-..."); set for KindIdentity only.
	UUID string
	// Detail is the rest of the line, after the fields above.
	Detail string
}

var (
	// Both forms in which drivers name a MIG instance: "GPU-I 1, CI 0" and "(GI 1, CI 0)".
	migRE = regexp.MustCompile(`\b(?:GPU-I|GI) (\d+)(?:, ?CI (\d+))?`)
	// XID 154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)".
	recoveryRE = regexp.MustCompile(`recovery action changed from 0x[0-9a-fA-F]+(?: \([^)]*\))? to 0x([0-9a-fA-F]+)`)
)

// ParseNVRM turns one NVIDIA driver message (the Message of a Record, or a syslog line with
// its prefix removed) into an Event. It returns false for any line that is not one of the
// NVRM forms it knows, NVRM lines it does not model included.
func ParseNVRM(msg string) (Event, bool) {
	rest, ok := strings.CutPrefix(strings.TrimLeft(msg, " \t"), "NVRM: ")
	if !ok {
		return Event{}, false
	}
	switch {
	case strings.HasPrefix(rest, "Xid ("):
		return parseXid(strings.TrimPrefix(rest, "Xid ("))
	case strings.HasPrefix(rest, "GPU at PCI:"):
		return parseGPUAt(strings.TrimPrefix(rest, "GPU at PCI:"))
	case strings.HasPrefix(rest, "GPU "):
		return parseGPU(strings.TrimPrefix(rest, "GPU "))
	case strings.HasPrefix(rest, "The NVIDIA GPU "):
		// Open and older modules spread this over three printk lines:
		// "The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n
		// NVRM: fallen off the bus and is not responding to commands."
		rest = strings.TrimPrefix(rest, "The NVIDIA GPU ")
		end := strings.IndexAny(rest, " \n")
		if end < 0 || !strings.Contains(rest, "fallen off the bus") {
			return Event{}, false
		}
		bus, ok := NormalizeBusID(rest[:end])
		if !ok {
			return Event{}, false
		}
		return Event{Kind: KindLost, PCIBusID: bus, Detail: strings.TrimSpace(rest[end:])}, true
	}
	return Event{}, false
}

// parseXid parses what follows "NVRM: Xid (":
//
//	PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
//	PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception ...
//	PCI:0000:3b:00): 48, An uncorrectable double bit error
//	PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 ...)  (NVLink5, see NVLinkError)
//	PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). ...  (MIG, R515+)
//	0000:01:00): 13, 0005 00000000 ...          (drivers before ~2013 had no "PCI:")
func parseXid(s string) (Event, bool) {
	addr, rest, ok := strings.Cut(s, "): ")
	if !ok {
		return Event{}, false
	}
	// With MIG on, the driver names the instance inside the parentheses, after the address.
	addr, attribution, _ := strings.Cut(addr, " ")
	// The very oldest drivers wrote a two-part address ("Xid (0009:00): 53"): the XID still
	// counts, but it cannot be attributed to a GPU, so PCIBusID stays empty.
	bus, _ := NormalizeBusID(strings.TrimPrefix(addr, "PCI:"))
	code, rest, _ := strings.Cut(rest, ",")
	// The code is the leading digits: "79", or "154 (" in a line cut short; digits are all a
	// reader can trust.
	digits := len(code) - len(strings.TrimLeft(code, "0123456789"))
	xid, err := strconv.Atoi(code[:digits])
	if err != nil || xid < 0 {
		return Event{}, false
	}
	ev := Event{Kind: KindXid, PCIBusID: bus, Xid: xid}
	rest = strings.TrimLeft(rest, " ")
	if v, r, ok := cutField(rest, "pid="); ok {
		rest = r
		if pid, err := strconv.Atoi(v); err == nil && pid > 0 {
			ev.PID = pid
		}
		if v, r, ok := cutField(rest, "name="); ok {
			rest = r
			if v != "<unknown>" {
				ev.Process = v
			}
		}
	}
	ev.Detail = rest
	ev.MIG = parseMIGAttribution(attribution)
	if ev.MIG == nil {
		ev.MIG = parseMIG(rest)
	}
	ev.NVLink = parseNVLink(rest)
	ev.CausedByXid = parseCausedBy(rest)
	if m := recoveryRE.FindStringSubmatch(rest); m != nil {
		if n, err := strconv.ParseUint(m[1], 16, 32); err == nil {
			a := RecoveryAction(n)
			ev.RecoveryAction = &a
		}
	}
	return ev, true
}

// parseMIG returns the MIG scope a line names, or nil. An instance number too large to be one
// leaves the XID on the whole GPU rather than on a wrong instance: failing safe.
func parseMIG(s string) *MIGScope {
	m := migRE.FindStringSubmatch(s)
	if m == nil {
		return nil
	}
	gi, err := strconv.ParseUint(m[1], 10, 31)
	if err != nil {
		return nil
	}
	scope := &MIGScope{GPUInstance: int(gi), ComputeInstance: -1}
	if m[2] != "" {
		ci, err := strconv.ParseUint(m[2], 10, 31)
		if err != nil {
			return nil
		}
		scope.ComputeInstance = int(ci)
	}
	return scope
}

// parseMIGAttribution parses the MIG instance the driver names beside the address, as
// kernel_rc.c (NVIDIA/open-gpu-kernel-modules, R515 to R595 at least) prints it: "GPU-I:05" or
// "GPU-I:01 GPU-CI:02". Anything else gives nil, like parseMIG: the XID then stays on the whole
// GPU.
func parseMIGAttribution(s string) *MIGScope {
	s, ok := strings.CutPrefix(s, "GPU-I:")
	if !ok {
		return nil
	}
	gi, ci, hasCI := strings.Cut(s, " GPU-CI:")
	n, err := strconv.ParseUint(gi, 10, 31)
	if err != nil {
		return nil
	}
	scope := &MIGScope{GPUInstance: int(n), ComputeInstance: -1}
	if hasCI {
		n, err := strconv.ParseUint(ci, 10, 31)
		if err != nil {
			return nil
		}
		scope.ComputeInstance = int(n)
	}
	return scope
}

// cutField cuts "key=value, " from the front of s; value loses the quotes some drivers put
// around <unknown>.
func cutField(s, key string) (value, rest string, ok bool) {
	s, ok = strings.CutPrefix(s, key)
	if !ok {
		return "", s, false
	}
	value, rest, _ = strings.Cut(s, ",")
	return strings.Trim(value, "'"), strings.TrimLeft(rest, " "), true
}

// cutBusID splits "0000:3b:00: the rest" into the GPU's address (NormalizeBusID) and the rest.
func cutBusID(s string) (bus, rest string, ok bool) {
	addr, rest, ok := strings.Cut(s, ": ")
	if !ok {
		return "", "", false
	}
	bus, ok = NormalizeBusID(addr)
	return bus, rest, ok
}

// parseGPUAt parses what follows "NVRM: GPU at PCI:":
//
//	0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375
//	0000:3b:00: GPU has fallen off the bus.
func parseGPUAt(s string) (Event, bool) {
	bus, rest, ok := cutBusID(s)
	if !ok {
		return Event{}, false
	}
	rest = strings.TrimSpace(rest)
	switch {
	case strings.HasPrefix(rest, "GPU-") && !strings.ContainsRune(rest, ' '):
		return Event{Kind: KindIdentity, PCIBusID: bus, UUID: rest}, true
	case strings.Contains(rest, "fallen off the bus"):
		return Event{Kind: KindLost, PCIBusID: bus, Detail: rest}, true
	}
	return Event{}, false
}

// parseGPU parses what follows "NVRM: GPU ":
//
//	0000:09:00.0: RmInitAdapter failed! (0x22:0x56:894)
//	0000:01:00.0: GPU has fallen off the bus.        (R610, after the XID 79 line)
//
// The "rm_init_adapter failed, device minor number 0" line that always follows the first is
// left out on purpose, so that one failure makes one event.
func parseGPU(s string) (Event, bool) {
	bus, rest, ok := cutBusID(s)
	if !ok {
		return Event{}, false
	}
	if detail, ok := strings.CutPrefix(rest, "RmInitAdapter failed!"); ok {
		return Event{Kind: KindInitFailed, PCIBusID: bus, Detail: strings.TrimSpace(detail)}, true
	}
	if strings.Contains(rest, "fallen off the bus") {
		return Event{Kind: KindLost, PCIBusID: bus, Detail: strings.TrimSpace(rest)}, true
	}
	return Event{}, false
}

// NormalizeBusID returns a PCI address in the form 0000:3b:00.0 (four-digit domain,
// lower case, function included). It accepts the driver's short form 0000:3b:00 (function 0
// implied), the full form, and NVML's eight-digit-domain form 00000000:3B:00.0, so that an
// event can be matched against the bus ID NVML reports for a device.
func NormalizeBusID(s string) (string, bool) {
	s = strings.TrimSpace(s)
	// The driver writes the domain in four digits and NVML in eight, always with it.
	domain, _, _ := strings.Cut(s, ":")
	if strings.Count(s, ":") != 2 || len(domain) != 4 && (len(domain) != 8 || !strings.HasPrefix(domain, "0000")) {
		return "", false
	}
	if !strings.Contains(s, ".") {
		s += ".0" // the driver's short form: function 0
	}
	out, err := health.NormalizePCIBusID(s)
	return out, err == nil
}
