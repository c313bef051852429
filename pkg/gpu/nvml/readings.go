package nvml

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Readings is one sampling round of one GPU. A nil field is a reading the GPU does not support
// (NVML answered ERROR_NOT_SUPPORTED, or the backend does not take it: see GPUReport.Unmonitored)
// or one that failed; Unsupported and Errors say which.
type Readings struct {
	Time time.Time `json:"time"`
	// Lost is set when NVML answered ERROR_GPU_IS_LOST; nothing else was read.
	Lost bool `json:"lost,omitempty"`
	// ResetRequired is set when NVML answered ERROR_RESET_REQUIRED: the GPU needs a reset
	// before it can be used again. Nothing else was read; Errors says which reading failed.
	ResetRequired bool `json:"resetRequired,omitempty"`

	ECC                 *ECCReading               `json:"ecc,omitempty"`
	RemappedRows        *RemappedRowsReading      `json:"remappedRows,omitempty"`
	RetiredPagesPending *bool                     `json:"retiredPagesPending,omitempty"`
	Temperature         *TemperatureReading       `json:"temperature,omitempty"`
	Power               *PowerReading             `json:"power,omitempty"`
	ClockEventReasons   *health.ClockEventReasons `json:"clockEventReasons,omitempty"`
	PCIeReplays         *int64                    `json:"pcieReplays,omitempty"`
	RowRemapHistogram   *RowRemapHistogramReading `json:"rowRemapHistogram,omitempty"`
	SRAM                *SRAMReading              `json:"sram,omitempty"`
	PCIeLink            *PCIeLinkReading          `json:"pcieLink,omitempty"`
	Fabric              *FabricReading            `json:"fabric,omitempty"`
	NVLinks             []NVLinkReading           `json:"nvlinks,omitempty"`
	// NVLinkFabricPending is set while Fabric Manager has not registered the GPU with its
	// NVLink fabric: no link is watched until it has.
	NVLinkFabricPending bool                    `json:"nvlinkFabricPending,omitempty"`
	NVLinkRecoveries    []NVLinkRecoveryReading `json:"nvlinkRecoveries,omitempty"`
	RecoveryAction      *health.RecoveryAction  `json:"recoveryAction,omitempty"`

	// Unsupported names the readings the GPU does not support, or that the backend does not
	// take on it ("no data", never a fault).
	Unsupported []string `json:"unsupported,omitempty"`
	// Errors lists readings that failed for any other reason.
	Errors []string `json:"errors,omitempty"`

	// checks says, for the checks the sampler tells the sink about round by round, whether
	// each ran this round (false) or cannot run (true: NOT_SUPPORTED, or a reading not
	// believed). A check absent from it is unchanged.
	checks []checkState
}

// checkState is one check's state in a round.
type checkState struct {
	check health.Check
	off   bool
}

// ECCReading is the volatile ECC totals (since the last GPU reset).
type ECCReading struct {
	Corrected   uint64 `json:"corrected"`
	Uncorrected uint64 `json:"uncorrected"`
}

// RemappedRowsReading is the row remapper's state.
type RemappedRowsReading struct {
	Corrected   int  `json:"corrected"`
	Uncorrected int  `json:"uncorrected"`
	Pending     bool `json:"pending"`
	Failure     bool `json:"failure"`
}

// TemperatureReading is the GPU temperature and the GPU's own thresholds (0 when unknown).
type TemperatureReading struct {
	CurrentC  int64 `json:"currentC"`
	SlowdownC int64 `json:"slowdownC,omitempty"`
	ShutdownC int64 `json:"shutdownC,omitempty"`
}

// PowerReading is the power draw and the enforced limit in milliwatts (0 when unknown).
type PowerReading struct {
	UsageMilliwatts uint32 `json:"usageMilliwatts"`
	LimitMilliwatts uint32 `json:"limitMilliwatts,omitempty"`
}

// NVLinkReading is one NVLink's state and its error counters' total (replay, recovery and CRC).
type NVLinkReading struct {
	Link int  `json:"link"`
	Down bool `json:"down"`
	// Errors is nil when no error counter of the link is supported.
	Errors *uint64 `json:"errors,omitempty"`
}

// Names of readings, as Readings.Unsupported and the probe report them.
const (
	ReadingECC            = "ecc"
	ReadingRemappedRows   = "remappedRows"
	ReadingRetiredPages   = "retiredPages"
	ReadingTemperature    = "temperature"
	ReadingPower          = "power"
	ReadingClockEvents    = "clockEventReasons"
	ReadingPCIeReplays    = "pcieReplays"
	ReadingNVLink         = "nvlink"
	ReadingRecoveryAction = "recoveryAction"

	ReadingRowRemapHistogram = "rowRemapHistogram"
	ReadingSRAM              = "sramEccStatus"
	ReadingPCIeLink          = "pcieLink"
	ReadingFabric            = "fabric"
	ReadingNVLinkRecoveries  = "nvlinkRecoveries"
)

// errBroken stops a round: once NVML says the GPU is lost or needs a reset, nothing else it
// says about it counts.
var errBroken = errors.New("GPU is lost or requires a reset")

// reader collects one round's readings and sorts each NVML answer into data, no data, error or
// broken GPU.
type reader struct {
	r *Readings
}

// check files ret under name and reports whether the reading produced data. It returns
// errBroken when the GPU is lost or needs a reset.
func (rd reader) check(name string, ret nvml.Return) (bool, error) {
	switch {
	case ret == nvml.SUCCESS:
		return true, nil
	case notSupported(ret):
		rd.r.Unsupported = append(rd.r.Unsupported, name)
	default:
		if err := rd.broken(name, ret); err != nil {
			return false, err
		}
		rd.r.Errors = append(rd.r.Errors, nvmlError("reading "+name, ret).Error())
	}
	return false, nil
}

// broken returns errBroken, and records why, when ret says the GPU is lost or needs a reset.
func (rd reader) broken(name string, ret nvml.Return) error {
	kind, ok := faultOf(ret)
	if !ok {
		return nil
	}
	if kind == health.SignalLost {
		rd.r.Lost = true
	} else {
		rd.r.ResetRequired = true
		rd.r.Errors = append(rd.r.Errors, nvmlError("reading "+name, ret).Error())
	}
	return errBroken
}

// checked records whether a check ran this round (off false) or cannot run (off true).
func (rd reader) checked(check health.Check, off bool) {
	rd.r.checks = append(rd.r.checks, checkState{check, off})
}

// implausible drops a reading no GPU can give (a glitch of the driver): no data this round,
// an error that says why, a glitch counted, and its check not running until a reading is
// believed again. It is never trusted, and never taken as a fault.
func (b *Backend) implausible(rd reader, reading string, check health.Check, what string) {
	rd.r.Errors = append(rd.r.Errors, fmt.Sprintf("reading %s: %s: not plausible, ignored", reading, what))
	b.stats.add(func(s *Stats) { s.Glitches++ })
	rd.checked(check, true)
}

// off lists a reading that is not taken on g as unsupported and reports whether it is off.
func (rd reader) off(g *gpu, name string) bool {
	if g.isOff(name) {
		rd.r.Unsupported = append(rd.r.Unsupported, name)
		return true
	}
	return false
}

// fault returns the signal for a round that ended because the GPU is broken.
func (r Readings) fault() (health.SignalKind, bool) {
	switch {
	case r.Lost:
		return health.SignalLost, true
	case r.ResetRequired:
		return health.SignalResetRequired, true
	}
	return 0, false
}

// read takes one round of readings from g. It does not touch the ECC memory used for reset
// detection; emit does.
func (b *Backend) read(g *gpu) Readings {
	r := Readings{Time: b.opts.clock.Now()}
	if g.handle == nil {
		// Not found after a reset: nothing to ask.
		r.Lost = true
		return r
	}
	if err := b.readInto(g, reader{&r}); err != nil {
		// What was read before NVML said so is meaningless.
		out := Readings{Time: r.Time, Lost: r.Lost, ResetRequired: r.ResetRequired}
		if r.ResetRequired {
			out.Errors = r.Errors[len(r.Errors)-1:] // the reading that said so
		}
		return out
	}
	return r
}

func (b *Backend) readInto(g *gpu, rd reader) error {
	// The fabric state comes before the NVLinks, which wait for it, and the links before
	// their recovery counts.
	for _, read := range [...]func(*gpu, reader) error{
		b.readECC, b.readRemappedRows, b.readRowRemapHistogram, b.readSRAM, b.readRetiredPages,
		b.readTemperature, b.readPower, b.readClockEvents, b.readPCIeReplays, b.readPCIeLink,
		b.readFabric, b.readNVLinks, b.readNVLinkRecoveries, b.readRecoveryAction,
	} {
		if err := read(g, rd); err != nil {
			return err
		}
	}
	return nil
}

// readECC reads the volatile ECC totals.
func (b *Backend) readECC(g *gpu, rd reader) error {
	if rd.off(g, ReadingECC) {
		return nil
	}
	corrected, ret := g.handle.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
	if ok, err := rd.check(ReadingECC, ret); !ok || err != nil {
		return err
	}
	uncorrected, ret := g.handle.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	ok, err := rd.check(ReadingECC, ret)
	if ok {
		rd.r.ECC = &ECCReading{Corrected: corrected, Uncorrected: uncorrected}
	}
	return err
}

func (b *Backend) readRemappedRows(g *gpu, rd reader) error {
	if rd.off(g, ReadingRemappedRows) {
		return nil
	}
	corrected, uncorrected, pending, failure, ret := g.handle.GetRemappedRows()
	ok, err := rd.check(ReadingRemappedRows, ret)
	if ok {
		rd.r.RemappedRows = &RemappedRowsReading{Corrected: corrected, Uncorrected: uncorrected, Pending: pending, Failure: failure}
	}
	return err
}

// readRetiredPages reads whether retired pages are pending. Ampere and later GPUs remap rows
// instead and do not retire pages: the reading is not taken on them (no data), and the row
// remapper covers their memory.
func (b *Backend) readRetiredPages(g *gpu, rd reader) error {
	if rd.off(g, ReadingRetiredPages) {
		return nil
	}
	if g.rowRemapper {
		rd.r.Unsupported = append(rd.r.Unsupported, ReadingRetiredPages)
		return nil
	}
	state, ret := g.handle.GetRetiredPagesPendingStatus()
	ok, err := rd.check(ReadingRetiredPages, ret)
	if ok {
		pending := state == nvml.FEATURE_ENABLED
		rd.r.RetiredPagesPending = &pending
	}
	return err
}

// MaxPlausibleTemperatureC is the hottest reading believed: above it a temperature (or a
// threshold) is a glitch of the driver, such as 4,294,967,295 °C, and is not passed on.
const MaxPlausibleTemperatureC = 200

// readTemperature reads the GPU temperature and the GPU's own thresholds. A threshold the GPU
// does not report stays 0: the library then uses its default.
func (b *Backend) readTemperature(g *gpu, rd reader) error {
	if rd.off(g, ReadingTemperature) {
		return nil
	}
	temp, ret := g.handle.GetTemperature(nvml.TEMPERATURE_GPU)
	if ok, err := rd.check(ReadingTemperature, ret); !ok || err != nil {
		return err
	}
	if temp > MaxPlausibleTemperatureC {
		// A reading no GPU can have is a glitch of the driver, not a GPU at its shutdown
		// temperature: no data this round.
		rd.r.Errors = append(rd.r.Errors, fmt.Sprintf("reading %s: %d °C is not a plausible GPU temperature (above %d): ignored", ReadingTemperature, temp, MaxPlausibleTemperatureC))
		b.stats.add(func(s *Stats) { s.Glitches++ })
		return nil
	}
	t := &TemperatureReading{CurrentC: int64(temp)}
	if b.sym.has(symTemperatureThreshold) {
		for _, th := range [...]struct {
			which nvml.TemperatureThresholds
			into  *int64
		}{{nvml.TEMPERATURE_THRESHOLD_SLOWDOWN, &t.SlowdownC}, {nvml.TEMPERATURE_THRESHOLD_SHUTDOWN, &t.ShutdownC}} {
			v, ret := g.handle.GetTemperatureThreshold(th.which)
			if ret == nvml.SUCCESS && v <= MaxPlausibleTemperatureC {
				*th.into = int64(v) // an implausible threshold stays 0: the library's default applies
			} else if err := rd.broken("temperature threshold", ret); err != nil {
				return err
			}
		}
	}
	rd.r.Temperature = t
	return nil
}

// readPower reads the power draw and the enforced limit (0 when unknown).
func (b *Backend) readPower(g *gpu, rd reader) error {
	if rd.off(g, ReadingPower) {
		return nil
	}
	usage, ret := g.handle.GetPowerUsage()
	if ok, err := rd.check(ReadingPower, ret); !ok || err != nil {
		return err
	}
	p := &PowerReading{UsageMilliwatts: usage}
	if b.sym.has(symEnforcedPowerLimit) {
		limit, ret := g.handle.GetEnforcedPowerLimit()
		if ret == nvml.SUCCESS {
			p.LimitMilliwatts = limit
		} else if err := rd.broken("enforced power limit", ret); err != nil {
			return err
		}
	}
	rd.r.Power = p
	return nil
}

// readClockEvents reads the clock-event reasons: with the call drivers 535 and later have, else
// with the throttle-reasons call it replaced.
func (b *Backend) readClockEvents(g *gpu, rd reader) error {
	if rd.off(g, ReadingClockEvents) {
		return nil
	}
	var reasons uint64
	ret := nvml.ERROR_FUNCTION_NOT_FOUND
	if b.sym.has(symClocksEventReasons) {
		reasons, ret = g.handle.GetCurrentClocksEventReasons()
	}
	if ret == nvml.ERROR_FUNCTION_NOT_FOUND && b.sym.has(symClocksThrottleReasons) {
		reasons, ret = g.handle.GetCurrentClocksThrottleReasons()
	}
	ok, err := rd.check(ReadingClockEvents, ret)
	if ok {
		v := health.ClockEventReasons(reasons)
		rd.r.ClockEventReasons = &v
	}
	return err
}

func (b *Backend) readPCIeReplays(g *gpu, rd reader) error {
	if rd.off(g, ReadingPCIeReplays) {
		return nil
	}
	replays, ret := g.handle.GetPcieReplayCounter()
	ok, err := rd.check(ReadingPCIeReplays, ret)
	if ok {
		v := int64(replays)
		rd.r.PCIeReplays = &v
	}
	return err
}

// readRecoveryAction reads FI_DEV_GET_GPU_RECOVERY_ACTION into the round.
func (b *Backend) readRecoveryAction(g *gpu, rd reader) error {
	action, ok, err := b.recoveryAction(g, rd)
	if ok {
		rd.r.RecoveryAction = &action
	}
	return err
}

// recoveryAction reads FI_DEV_GET_GPU_RECOVERY_ACTION. Drivers that predate the field answer
// NOT_SUPPORTED in the field's own return code. NVML's value is passed on as it is, also one
// newer than this package: the library fails safe on values it does not know.
func (b *Backend) recoveryAction(g *gpu, rd reader) (health.RecoveryAction, bool, error) {
	if rd.off(g, ReadingRecoveryAction) {
		return 0, false, nil
	}
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION, ScopeId: 0}}
	ret := g.handle.GetFieldValues(values)
	if ret == nvml.SUCCESS {
		ret = nvml.Return(values[0].NvmlReturn)
	}
	ok, err := rd.check(ReadingRecoveryAction, ret)
	if !ok || err != nil {
		return 0, false, err
	}
	v, known := fieldValue(values[0])
	if !known || v > math.MaxUint8 {
		rd.r.Errors = append(rd.r.Errors, fmt.Sprintf("reading %s: unexpected value type %d or value %d", ReadingRecoveryAction, values[0].ValueType, v))
		return 0, false, nil
	}
	return health.RecoveryAction(v), true, nil
}

// fieldValue decodes an integer field value; the union is in host byte order.
func fieldValue(f nvml.FieldValue) (uint64, bool) {
	switch nvml.ValueType(f.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(f.Value[:4])), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return binary.NativeEndian.Uint64(f.Value[:]), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.NativeEndian.Uint16(f.Value[:2])), true
	default:
		return 0, false
	}
}
