package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// kmsgEvent checks a kmsg event: the line must be an NVRM line the kernel-log parser knows,
// about a simulated GPU, so that a typo fails when the scenario loads instead of doing nothing.
// A record of another facility than the kernel's is accepted: it shows that spoofed lines are
// ignored.
func (sc *Scenario) kmsgEvent(spec eventSpec, ev Event) (Event, error) {
	if spec.GPU != nil {
		return ev, errors.New("gpu: a kmsg line names its GPU by PCI address; remove gpu")
	}
	if spec.GPUInstance != nil || spec.ComputeInstance != nil {
		return ev, errors.New("gpuInstance/computeInstance: a kmsg line carries its own MIG scope")
	}
	rec, err := kmsgRecord(*spec.Kmsg)
	if err != nil {
		return ev, fmt.Errorf("kmsg: %w", err)
	}
	nvrm, ok := kmsg.ParseNVRM(rec.Message)
	if !ok {
		return ev, fmt.Errorf("kmsg: %q is not an NVRM line the parser knows (an XID, a GPU fallen off the bus, RmInitAdapter failed, or GPU at PCI:...: GPU-<uuid>)", rec.Message)
	}
	sigs, err := kmsg.NewMapper(slices.Concat(sc.Devices(), sc.Placeholders())).Signals(nvrm, time.Time{}, nil)
	switch {
	case errors.Is(err, kmsg.ErrBadXID):
		return ev, fmt.Errorf("kmsg: XID %d: %w", nvrm.Xid, err)
	case err != nil && nvrm.Kind == kmsg.KindIdentity:
		return ev, fmt.Errorf("kmsg: %s is no simulated GPU", nvrm.UUID)
	case err != nil && nvrm.PCIBusID == "":
		return ev, errors.New("kmsg: the XID's address is in a form too old to name a GPU; write it as PCI:0000:bb:dd")
	case err != nil:
		return ev, fmt.Errorf("kmsg: no simulated GPU at PCI address %s (they are at %s)", nvrm.PCIBusID, sc.busIDs())
	}
	// The event is about the GPU the line names, like any other event.
	uuid := nvrm.UUID
	if len(sigs) > 0 {
		uuid = sigs[0].Device
	}
	for i := range sc.GPUCount {
		if GPUUUID(sc.Node, i) == uuid {
			ev.GPU = i
		}
	}
	ev.Kmsg = rec
	return ev, nil
}

// kmsgRecord reads a scenario's kmsg line: a whole /dev/kmsg record when it has the record's
// prefix, else a message the kernel logged.
func kmsgRecord(line string) (kmsg.Record, error) {
	if prefix, _, ok := strings.Cut(line, ";"); ok && strings.Count(prefix, ",") >= 3 && !strings.Contains(prefix, " ") {
		return kmsg.ParseRecord(line)
	}
	if strings.ContainsAny(line, "\x00") {
		return kmsg.Record{}, errors.New("the line holds a NUL byte")
	}
	return kmsg.Record{Facility: kmsg.FacilityKernel, Level: kmsg.LevelErr, Flags: "-", Message: line}, nil
}

func (sc *Scenario) busIDs() string {
	var ids []string
	for _, d := range sc.Devices() {
		if d.MIG == nil {
			id, _ := kmsg.NormalizeBusID(d.PCIBusID)
			ids = append(ids, id)
		}
	}
	if len(ids) > 4 {
		ids = append(ids[:2], "...", ids[len(ids)-1])
	}
	return strings.Join(ids, ", ")
}

// applyKmsg feeds one kernel-log line through the parser and the mapper, as the agent's kernel
// log source does: only kernel-facility records count. A GPU the line reports lost stays lost.
func (b *Backend) applyKmsg(ev Event, now time.Time, sink gpu.Sink) {
	if ev.Kmsg.Facility != kmsg.FacilityKernel {
		b.spoofed++
		return
	}
	nvrm, ok := kmsg.ParseNVRM(ev.Kmsg.Message)
	if !ok {
		return // unreachable: the scenario was checked
	}
	var err error
	b.kmsgSignals, err = b.mapper.Signals(nvrm, now, b.kmsgSignals[:0])
	if err != nil {
		return // unreachable: the scenario was checked
	}
	for _, s := range b.kmsgSignals {
		if s.Kind == health.SignalLost {
			for _, g := range b.gpus {
				if g.uuid == s.Device {
					g.lost = true
				}
			}
		}
		sink.Signal(s)
	}
}

// SpoofedKmsg returns how many kmsg events of the scenario were ignored because their record
// was not logged by the kernel.
func (b *Backend) SpoofedKmsg() int { return b.spoofed }
