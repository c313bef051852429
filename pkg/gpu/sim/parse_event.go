package sim

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Parsing one event of a scenario: when it happens, which kind it is, which GPU it concerns.
// The fields of each kind are parsed in parse_faults.go (and, for the kinds with a file of
// their own, in kmsg.go, peers.go, earlywarnings.go and diag.go).

func (sc *Scenario) event(spec eventSpec, line int) (Event, error) {
	ev := Event{Line: line, GPU: -1, Repeat: 1}
	if err := eventTiming(spec, &ev); err != nil {
		return ev, err
	}
	kind, err := eventKind(spec)
	if err != nil {
		return ev, err
	}
	ev.Kind = kind
	// The kinds that concern no GPU of the scenario, or name theirs in their own way.
	switch ev.Kind {
	case EventKmsg:
		return sc.kmsgEvent(spec, ev)
	case EventPeerFault:
		return sc.peerFaultEvent(spec, ev)
	case EventDriver:
		err := driverEvent(spec, &ev)
		return ev, err
	case EventReboot:
		return ev, rebootEvent(spec)
	}
	if err := sc.eventGPU(spec, &ev); err != nil {
		return ev, err
	}
	err = gpuEvent(spec, &ev)
	return ev, err
}

// eventTiming reads when the event happens (at, or afterReset) and how many times (repeat).
func eventTiming(spec eventSpec, ev *Event) error {
	at, field := spec.At, "at"
	switch {
	case spec.At != nil && spec.AfterReset != nil:
		return errors.New("at and afterReset: give one (afterReset repeats the event after every reset of its GPU)")
	case spec.AfterReset != nil:
		at, field = spec.AfterReset, "afterReset"
		if spec.Reset != nil || spec.Reboot != nil || spec.Driver != nil {
			return errors.New("afterReset: only faults of a GPU can follow its reset")
		}
	case spec.At == nil:
		return errors.New("at: required (a duration from the scenario start, such as 5s)")
	}
	if *at < 0 {
		return errors.New(field + ": must not be negative")
	}
	ev.At = time.Duration(*at)
	if spec.Repeat != nil {
		if *spec.Repeat < 1 || *spec.Repeat > MaxRepeat {
			return fmt.Errorf("repeat: must be between 1 and %d, got %d", MaxRepeat, *spec.Repeat)
		}
		ev.Repeat = *spec.Repeat
	}
	return nil
}

// eventKind returns the kind of the one fault or repair the event gives.
func eventKind(spec eventSpec) (EventKind, error) {
	var kinds []EventKind
	add := func(set bool, k EventKind) {
		if set {
			kinds = append(kinds, k)
		}
	}
	add(spec.XID != nil, EventXID)
	add(spec.ECC != nil, EventECC)
	add(spec.RemappedRows != nil, EventRemappedRows)
	add(spec.RetiredPages != nil, EventRetiredPages)
	add(spec.TemperatureC != nil, EventTemperature)
	add(spec.ClockEventReasons != nil, EventClockEventReasons)
	add(spec.PCIeReplays != nil, EventPCIeReplays)
	add(spec.NVLink != nil, EventNVLink)
	add(spec.RecoveryAction != nil, EventRecoveryAction)
	add(spec.Lost != nil, EventLost)
	add(spec.Reset != nil, EventReset)
	add(spec.Reboot != nil, EventReboot)
	add(spec.Kmsg != nil, EventKmsg)
	add(spec.Driver != nil, EventDriver)
	add(spec.Hang != nil, EventHang)
	add(spec.OutOfRange != nil, EventOutOfRange)
	add(spec.ReadsLower != nil, EventReadsLower)
	add(spec.Fabric != nil, EventFabric)
	add(spec.RowRemapHistogram != nil, EventRowRemapHistogram)
	add(spec.SRAMExceeded != nil, EventSRAM)
	add(spec.PCIeLink != nil, EventPCIeLink)
	add(spec.NVLinkRecoveries != nil, EventNVLinkRecoveries)
	add(spec.MIGInstances != nil, EventMIG)
	add(spec.PeerFault != nil, EventPeerFault)
	add(spec.Latent != nil, EventLatent)
	add(spec.Diag != nil, EventDiag)
	switch len(kinds) {
	case 0:
		return "", errors.New("no fault or repair given: set one of xid, ecc, remappedRows, retiredPages, temperatureC, clockEventReasons, pcieReplays, nvlink, recoveryAction, lost, reset, reboot, kmsg, fabric, rowRemapHistogram, sramThresholdExceeded, pcieLink, nvlinkRecoveries, peerFault, latent, diag (and, for the simulated driver, driver, hang, outOfRange, readsLower, migInstances)")
	case 1:
		return kinds[0], nil
	default:
		return "", fmt.Errorf("%s and %s in one event: give each its own event", kinds[0], kinds[1])
	}
}

// eventGPU resolves the GPU (or MIG instance) an event of a GPU names, and refuses the fields
// that qualify only an XID.
func (sc *Scenario) eventGPU(spec eventSpec, ev *Event) error {
	if spec.GPU == nil {
		return errors.New("gpu: required (an index or a UUID)")
	}
	if err := sc.resolveGPU(*spec.GPU, ev); err != nil {
		return err
	}
	if ev.MIG > 0 && ev.Kind != EventXID {
		return fmt.Errorf("gpu: %s events concern the physical GPU; name GPU %d instead of a MIG instance", ev.Kind, ev.GPU)
	}
	if (spec.XIDSeverity != nil || spec.CausedByPrevious != nil) && ev.Kind != EventXID {
		return errors.New("xidSeverity/causedByPrevious: only qualify an xid")
	}
	if (spec.GPUInstance != nil || spec.ComputeInstance != nil) && ev.Kind != EventXID {
		return errors.New("gpuInstance/computeInstance: only XIDs can be scoped to a MIG instance")
	}
	if spec.ComputeInstance != nil && spec.GPUInstance == nil {
		return errors.New("computeInstance: needs gpuInstance")
	}
	return nil
}

func (sc *Scenario) resolveGPU(ref gpuRef, ev *Event) error {
	if ref.uuid == "" {
		if ref.index < 0 || ref.index >= sc.GPUCount {
			return fmt.Errorf("gpu: index %d is out of range (the scenario has %d GPUs: 0 to %d)", ref.index, sc.GPUCount, sc.GPUCount-1)
		}
		ev.GPU = ref.index
		return sc.notMissing(ev.GPU)
	}
	for i := range sc.GPUCount {
		if strings.EqualFold(ref.uuid, GPUUUID(sc.Node, i)) {
			ev.GPU = i
			return sc.notMissing(i)
		}
		for m := 1; m <= sc.MIGInstances[i]; m++ {
			if strings.EqualFold(ref.uuid, MIGUUID(sc.Node, i, m)) {
				ev.GPU, ev.MIG = i, m
				return nil
			}
		}
	}
	return fmt.Errorf("gpu: no GPU or MIG instance has UUID %q", ref.uuid)
}

// notMissing refuses an event about a GPU the driver does not answer for.
func (sc *Scenario) notMissing(i int) error {
	if sc.Missing[i] {
		return fmt.Errorf("gpu: GPU %d is in gpus.missing: the driver answers nothing for it (a kmsg line naming its PCI address can)", i)
	}
	return nil
}
