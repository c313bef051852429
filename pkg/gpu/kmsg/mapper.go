package kmsg

import (
	"errors"
	"math"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

var (
	// ErrUnknownDevice is returned for an event about a PCI address (or, for an identity line,
	// a UUID) that is not a GPU of the inventory: a GPU the agent does not watch, or an XID in
	// the oldest address form, which names no GPU.
	ErrUnknownDevice = errors.New("no GPU of the inventory at this address")
	// ErrBadXID is returned for an XID code that cannot be one: 0, or larger than the 32 bits
	// NVML gives an XID. XIDs merely missing from the XID catalog are not bad: they reach the
	// policy's rule for unknown XIDs, exactly as NVML's do.
	ErrBadXID = errors.New("not a valid XID code")
)

// Mapper turns NVRM events into the library's signals for one inventory of GPUs. It learns
// from identity lines ("GPU at PCI:...: GPU-<uuid>") which GPU sits at which address, so that a
// GPU whose bus ID NVML could not read is still named. A Mapper is not safe for concurrent use.
type Mapper struct {
	byBus map[string]string // normalised PCI address to the UUID of a whole GPU
	known map[string]bool   // UUIDs of the whole GPUs in the inventory
}

// NewMapper returns a Mapper for devices. MIG instances are left out: the kernel log names the
// physical GPU and the MIG instance separately, and the library's XID check finds the instance
// from the GPU's signal.
func NewMapper(devices []health.Device) *Mapper {
	m := &Mapper{byBus: map[string]string{}, known: map[string]bool{}}
	for _, d := range devices {
		if d.MIG != nil {
			continue
		}
		m.known[d.UUID] = true
		if bus, ok := NormalizeBusID(d.PCIBusID); ok {
			m.byBus[bus] = d.UUID
		}
	}
	return m
}

// Signals appends to out the signals ev means, stamped at:
//
//   - an XID gives SignalXID with its code, MIG scope and what the driver said beside the code
//     (XIDFlags, Link and Unit: see qualify), and XID 154 also SignalRecoveryAction with the
//     line's new action (NVML's own backend reads the action at that XID instead);
//   - a GPU lost from the bus, or one the driver failed to initialise, gives SignalLost: in
//     both the driver cannot use the GPU until a reset or a reboot, which is what the lost
//     condition says and clears on, and NVML answers neither GPU;
//   - an identity line gives nothing, but teaches the Mapper the GPU's address.
//
// It returns ErrUnknownDevice or ErrBadXID, appending nothing, for events it cannot attribute.
func (m *Mapper) Signals(ev Event, at time.Time, out []health.Signal) ([]health.Signal, error) {
	if ev.Kind == KindIdentity {
		if !m.known[ev.UUID] {
			return out, ErrUnknownDevice
		}
		m.byBus[ev.PCIBusID] = ev.UUID
		return out, nil
	}
	uuid, ok := m.byBus[ev.PCIBusID]
	if !ok {
		return out, ErrUnknownDevice
	}
	base := health.Signal{Device: uuid, Time: at}
	switch ev.Kind {
	case KindXid:
		if ev.Xid <= 0 || ev.Xid > math.MaxUint32 {
			return out, ErrBadXID
		}
		s := base
		s.Kind, s.XID = health.SignalXID, uint32(ev.Xid)
		if ev.MIG != nil {
			s.MIGScoped, s.GPUInstance, s.ComputeInstance = true, uint32(ev.MIG.GPUInstance), health.NoInstance
			if ev.MIG.ComputeInstance >= 0 {
				s.ComputeInstance = uint32(ev.MIG.ComputeInstance)
			}
		}
		qualify(&s, ev)
		out = append(out, s)
		if ev.RecoveryAction != nil {
			a := base
			a.Kind, a.Action = health.SignalRecoveryAction, recoveryAction(*ev.RecoveryAction)
			out = append(out, a)
		}
	case KindLost, KindInitFailed:
		s := base
		s.Kind = health.SignalLost
		out = append(out, s)
	}
	return out, nil
}

// recoveryAction converts the driver's number; one beyond what the library can hold becomes
// the largest value, which the recovery check treats as an action it does not know (failing
// safe) rather than wrapping around to "none".
func recoveryAction(a RecoveryAction) health.RecoveryAction {
	if a > math.MaxUint8 {
		return math.MaxUint8
	}
	return health.RecoveryAction(a)
}

const (
	// maxLinks bounds the link a signal may name: the health library keeps state for NVLinks
	// 0..63 only (its maxTrackedLinks); a GB200 has 18.
	maxLinks = 64
	// maxUnitLen bounds a unit name; the driver's are under 20 characters ("NETIR_LINK_EVT",
	// "TLW_RX/TLW_RX_PIPE0").
	maxUnitLen = 32
)

// qualify copies onto an XID signal what the line said beside the code. A qualifier that cannot
// be right (a link beyond what the library tracks, a unit too long or not printable) is left
// out; the XID itself always counts, so garbage beside a code never hides a fault.
func qualify(s *health.Signal, ev Event) {
	if ev.CausedByXid > 0 {
		s.XIDFlags |= health.XIDCausedByPrevious
		if ev.CausedByXid <= math.MaxUint32 {
			s.CauseXID = uint32(ev.CausedByXid)
		}
	}
	nv := ev.NVLink
	if nv == nil {
		return
	}
	switch nv.Severity {
	case SeverityNonfatal:
		s.XIDFlags |= health.XIDNonfatal
	case SeverityFatal:
		s.XIDFlags |= health.XIDFatal
	}
	if nv.Link >= 0 && nv.Link < maxLinks {
		s.XIDFlags |= health.XIDHasLink
		s.Link = uint32(nv.Link)
	}
	if validUnit(nv.Unit) {
		// A copy: the signal may be kept for as long as the condition lasts, and a substring
		// would keep the whole kernel record alive with it.
		s.Unit = strings.Clone(nv.Unit)
	}
}

// validUnit reports whether a unit name is one the library may show: 1 to maxUnitLen printable
// ASCII characters, no spaces. The driver's units are upper-case mnemonics; anything else came
// from a damaged record.
func validUnit(u string) bool {
	if u == "" || len(u) > maxUnitLen {
		return false
	}
	for i := range len(u) {
		if u[i] <= ' ' || u[i] > '~' {
			return false
		}
	}
	return true
}
