package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The parsers of the event kinds, by family: each checks its kinds' fields in the scenario file
// and fills ev.

// gpuEvent parses the fields of an event about one GPU, once its GPU is resolved.
func gpuEvent(spec eventSpec, ev *Event) error {
	switch ev.Kind {
	case EventXID:
		return xidEvent(spec, ev)
	case EventECC, EventRemappedRows, EventRetiredPages:
		return memoryEvent(spec, ev)
	case EventTemperature, EventClockEventReasons, EventPCIeReplays, EventRecoveryAction:
		return sensorEvent(spec, ev)
	case EventNVLink:
		return nvlinkEvent(*spec.NVLink, ev)
	case EventLost:
		if !*spec.Lost {
			return errors.New("lost: only 'lost: true' is meaningful; a lost GPU comes back with a reboot")
		}
	case EventReset:
		if !*spec.Reset {
			return errors.New("reset: only 'reset: true' is meaningful")
		}
	case EventHang, EventOutOfRange, EventReadsLower, EventMIG:
		return driverOnlyEvent(spec, ev)
	case EventFabric, EventRowRemapHistogram, EventSRAM, EventPCIeLink, EventNVLinkRecoveries:
		return earlyWarningEvent(spec, ev)
	case EventLatent, EventDiag:
		return diagEvent(spec, ev)
	}
	return nil
}

// driverEvent parses an unload or a load of the driver, which serves the whole node.
func driverEvent(spec eventSpec, ev *Event) error {
	if *spec.Driver != DriverUnload && *spec.Driver != DriverLoad {
		return fmt.Errorf("driver: must be %s or %s, got %q", DriverUnload, DriverLoad, *spec.Driver)
	}
	if spec.GPU != nil {
		return errors.New("gpu: the driver serves the whole node; remove gpu")
	}
	if spec.Repeat != nil {
		return errors.New("repeat: a driver is unloaded or loaded once")
	}
	ev.DriverAction = *spec.Driver
	return nil
}

// rebootEvent checks a reboot, which concerns the whole node.
func rebootEvent(spec eventSpec) error {
	if !*spec.Reboot {
		return errors.New("reboot: only 'reboot: true' is meaningful")
	}
	if spec.GPU != nil {
		return errors.New("gpu: a reboot concerns the whole node; remove gpu")
	}
	return nil
}

// xidEvent parses an XID, its MIG scope and the qualifiers the driver gives NVLink5 XIDs.
func xidEvent(spec eventSpec, ev *Event) error {
	if *spec.XID == 0 {
		return errors.New("xid: must be a positive XID number")
	}
	ev.XID = *spec.XID
	if ev.MIG > 0 && spec.GPUInstance != nil {
		return errors.New("gpuInstance: the gpu is already a MIG instance")
	}
	ev.GPUInstance, ev.ComputeInstance = spec.GPUInstance, spec.ComputeInstance
	if spec.XIDSeverity != nil {
		switch *spec.XIDSeverity {
		case "Fatal":
			ev.XIDFlags |= health.XIDFatal
		case "Nonfatal":
			ev.XIDFlags |= health.XIDNonfatal
		default:
			return fmt.Errorf("xidSeverity: want Fatal or Nonfatal (as the driver logs NVLink5 XIDs), got %q", *spec.XIDSeverity)
		}
	}
	if spec.CausedByPrevious != nil && *spec.CausedByPrevious {
		ev.XIDFlags |= health.XIDCausedByPrevious
	}
	return nil
}

// nvlinkEvent parses a link going down or up, or an increase of its CRC error counter.
func nvlinkEvent(l linkSpec, ev *Event) error {
	if l.Link == nil {
		return errors.New("nvlink.link: required")
	}
	if *l.Link >= MaxNVLinks {
		return fmt.Errorf("nvlink.link: must be below %d, got %d", MaxNVLinks, *l.Link)
	}
	if (l.Down == nil) == (l.CRCErrors == nil) {
		return errors.New("nvlink: set exactly one of down or crcErrors")
	}
	if l.CRCErrors != nil && *l.CRCErrors < 0 {
		return errors.New("nvlink.crcErrors: a counter increase must not be negative")
	}
	ev.Link, ev.LinkDown = *l.Link, l.Down
	if l.CRCErrors != nil {
		ev.LinkErrorsIncrease = *l.CRCErrors
	}
	return nil
}

// memoryEvent parses the memory's faults: ECC counter increases, the row remapper's pending
// and failure flags, pending page retirements.
func memoryEvent(spec eventSpec, ev *Event) error {
	switch ev.Kind {
	case EventECC:
		e := spec.ECC
		if e.CorrectedVolatile == nil && e.UncorrectedVolatile == nil {
			return errors.New("ecc: set correctedVolatile or uncorrectedVolatile (a counter increase)")
		}
		ev.CorrectedIncrease = ptr.Deref(e.CorrectedVolatile, 0)
		ev.UncorrectedIncrease = ptr.Deref(e.UncorrectedVolatile, 0)
	case EventRemappedRows:
		r := spec.RemappedRows
		if r.Pending == nil && r.Failure == nil {
			return errors.New("remappedRows: set pending or failure")
		}
		ev.RowsPending, ev.RowsFailure = r.Pending, r.Failure
	case EventRetiredPages:
		if spec.RetiredPages.Pending == nil {
			return errors.New("retiredPages: set pending")
		}
		ev.PagesPending = *spec.RetiredPages.Pending
	}
	return nil
}

// sensorEvent parses a new reading of a polled sensor: the temperature, the clock-event
// reasons, an increase of the PCIe replay counter, the recovery action the driver asks for.
func sensorEvent(spec eventSpec, ev *Event) error {
	switch ev.Kind {
	case EventTemperature:
		if c := *spec.TemperatureC; c < -50 || c > 200 {
			return fmt.Errorf("temperatureC: %d is not a plausible GPU temperature (-50 to 200)", c)
		}
		ev.TemperatureC = *spec.TemperatureC
	case EventClockEventReasons:
		for i, name := range *spec.ClockEventReasons {
			r, err := health.ParseClockEventReason(name)
			if err != nil {
				return fmt.Errorf("clockEventReasons[%d]: %w", i, err)
			}
			ev.ClockEventReasons |= r
		}
	case EventPCIeReplays:
		if *spec.PCIeReplays < 0 {
			return errors.New("pcieReplays: a counter increase must not be negative")
		}
		ev.PCIeReplaysIncrease = *spec.PCIeReplays
	case EventRecoveryAction:
		a, err := health.ParseRecoveryAction(*spec.RecoveryAction)
		if err != nil {
			return fmt.Errorf("recoveryAction: %w", err)
		}
		ev.RecoveryAction = a
	}
	return nil
}

// driverOnlyEvent parses the events only the simulated driver answers on a GPU: a hang, a
// reading out of range or lower than the last, a new MIG layout.
func driverOnlyEvent(spec eventSpec, ev *Event) error {
	switch ev.Kind {
	case EventHang:
		if d := time.Duration(*spec.Hang); d <= 0 || d > MaxHang {
			return fmt.Errorf("hang: must be more than 0 and at most %v, got %v", MaxHang, d)
		}
		ev.Hang = time.Duration(*spec.Hang)
	case EventOutOfRange:
		return glitchEvent("outOfRange", *spec.OutOfRange, OutOfRangeReadings, ev)
	case EventReadsLower:
		return glitchEvent("readsLower", *spec.ReadsLower, ReadsLowerReadings, ev)
	case EventMIG:
		if n := *spec.MIGInstances; n < 0 || n > MaxMIGInstances {
			return fmt.Errorf("migInstances: must be between 0 (MIG off) and %d, got %d", MaxMIGInstances, n)
		}
		ev.MIGCount = *spec.MIGInstances
	}
	return nil
}

// glitchEvent parses the reading an outOfRange or readsLower event (field) names, one of
// readings.
func glitchEvent(field, reading string, readings []string, ev *Event) error {
	if !slices.Contains(readings, reading) {
		return fmt.Errorf("%s: must be one of %s, got %q", field, strings.Join(readings, ", "), reading)
	}
	ev.Reading = reading
	return nil
}
