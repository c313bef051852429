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
// (NVML answered ERROR_NOT_SUPPORTED) or one that failed; Unsupported and Errors say which.
type Readings struct {
	Time time.Time `json:"time"`
	// Lost is set when NVML answered ERROR_GPU_IS_LOST; nothing else was read.
	Lost bool `json:"lost,omitempty"`

	ECC                 *ECCReading               `json:"ecc,omitempty"`
	RemappedRows        *RemappedRowsReading      `json:"remappedRows,omitempty"`
	RetiredPagesPending *bool                     `json:"retiredPagesPending,omitempty"`
	Temperature         *TemperatureReading       `json:"temperature,omitempty"`
	Power               *PowerReading             `json:"power,omitempty"`
	ClockEventReasons   *health.ClockEventReasons `json:"clockEventReasons,omitempty"`
	PCIeReplays         *int64                    `json:"pcieReplays,omitempty"`
	NVLinks             []NVLinkReading           `json:"nvlinks,omitempty"`
	RecoveryAction      *health.RecoveryAction    `json:"recoveryAction,omitempty"`

	// Unsupported names the readings the GPU does not support ("no data", never a fault).
	Unsupported []string `json:"unsupported,omitempty"`
	// Errors lists readings that failed for any other reason.
	Errors []string `json:"errors,omitempty"`
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
)

var nvlinkCounters = []nvml.NvLinkErrorCounter{
	nvml.NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_CRC_FLIT, nvml.NVLINK_ERROR_DL_CRC_DATA,
}

// errLost stops a round: once NVML says the GPU is lost, nothing else it says about it counts.
var errLost = errors.New("GPU is lost")

// reader collects one round's readings and sorts each NVML answer into data, no data, error or
// lost.
type reader struct {
	r *Readings
}

// check files ret under name and reports whether the reading produced data. It returns errLost
// when the GPU is lost.
func (rd reader) check(name string, ret nvml.Return) (bool, error) {
	switch {
	case ret == nvml.SUCCESS:
		return true, nil
	case lost(ret):
		rd.r.Lost = true
		return false, errLost
	case notSupported(ret):
		rd.r.Unsupported = append(rd.r.Unsupported, name)
	default:
		rd.r.Errors = append(rd.r.Errors, nvmlError("reading "+name, ret).Error())
	}
	return false, nil
}

// read takes one round of readings from g. It does not touch the ECC memory used for reset
// detection; emit does.
func (b *Backend) read(g *gpu) Readings {
	r := Readings{Time: b.opts.clock.Now()}
	if err := b.readInto(g, reader{&r}); err != nil {
		// Lost: what was read before NVML said so is meaningless.
		return Readings{Time: r.Time, Lost: true}
	}
	return r
}

func (b *Backend) readInto(g *gpu, rd reader) error {
	h, r := g.handle, rd.r

	corrected, ret := h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
	ok, err := rd.check(ReadingECC, ret)
	if err != nil {
		return err
	}
	if ok {
		uncorrected, ret := h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		if ok, err = rd.check(ReadingECC, ret); err != nil {
			return err
		} else if ok {
			r.ECC = &ECCReading{Corrected: corrected, Uncorrected: uncorrected}
		}
	}

	if err := readRemappedRows(h, rd); err != nil {
		return err
	}

	state, ret := h.GetRetiredPagesPendingStatus()
	if ok, err = rd.check(ReadingRetiredPages, ret); err != nil {
		return err
	} else if ok {
		pending := state == nvml.FEATURE_ENABLED
		r.RetiredPagesPending = &pending
	}

	temp, ret := h.GetTemperature(nvml.TEMPERATURE_GPU)
	if ok, err = rd.check(ReadingTemperature, ret); err != nil {
		return err
	} else if ok {
		t := &TemperatureReading{CurrentC: int64(temp)}
		// Thresholds that the GPU does not report stay 0: the library then uses its defaults.
		if v, ret := h.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN); ret == nvml.SUCCESS {
			t.SlowdownC = int64(v)
		} else if lost(ret) {
			return rd.lostNow()
		}
		if v, ret := h.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SHUTDOWN); ret == nvml.SUCCESS {
			t.ShutdownC = int64(v)
		} else if lost(ret) {
			return rd.lostNow()
		}
		r.Temperature = t
	}

	usage, ret := h.GetPowerUsage()
	if ok, err = rd.check(ReadingPower, ret); err != nil {
		return err
	} else if ok {
		p := &PowerReading{UsageMilliwatts: usage}
		if limit, ret := h.GetEnforcedPowerLimit(); ret == nvml.SUCCESS {
			p.LimitMilliwatts = limit
		} else if lost(ret) {
			return rd.lostNow()
		}
		r.Power = p
	}

	reasons, ret := h.GetCurrentClocksEventReasons()
	if ret == nvml.ERROR_FUNCTION_NOT_FOUND {
		// Drivers before the "clocks event" rename only have the throttle-reasons call.
		reasons, ret = h.GetCurrentClocksThrottleReasons()
	}
	if ok, err = rd.check(ReadingClockEvents, ret); err != nil {
		return err
	} else if ok {
		v := health.ClockEventReasons(reasons)
		r.ClockEventReasons = &v
	}

	replays, ret := h.GetPcieReplayCounter()
	if ok, err = rd.check(ReadingPCIeReplays, ret); err != nil {
		return err
	} else if ok {
		v := int64(replays)
		r.PCIeReplays = &v
	}

	if err := b.readNVLinks(g, rd); err != nil {
		return err
	}

	action, ok, err := readRecoveryAction(h, rd)
	if err != nil {
		return err
	} else if ok {
		r.RecoveryAction = &action
	}
	return nil
}

func (rd reader) lostNow() error {
	rd.r.Lost = true
	return errLost
}

func readRemappedRows(h nvml.Device, rd reader) error {
	corrected, uncorrected, pending, failure, ret := h.GetRemappedRows()
	ok, err := rd.check(ReadingRemappedRows, ret)
	if ok {
		rd.r.RemappedRows = &RemappedRowsReading{Corrected: corrected, Uncorrected: uncorrected, Pending: pending, Failure: failure}
	}
	return err
}

// readNVLinks reads the links found on the first round. A GPU without NVLink answers
// NOT_SUPPORTED for link 0; links past the last answer INVALID_ARGUMENT.
func (b *Backend) readNVLinks(g *gpu, rd reader) error {
	g.mu.Lock()
	if !g.linksScanned {
		g.links = g.links[:0]
		for link := range nvml.NVLINK_MAX_LINKS {
			_, ret := g.handle.GetNvLinkState(link)
			if ret == nvml.SUCCESS {
				g.links = append(g.links, link)
				continue
			}
			if lost(ret) {
				g.mu.Unlock()
				return rd.lostNow()
			}
			if notSupported(ret) && link > 0 {
				continue // a disabled link on a GPU that has others
			}
			if !notSupported(ret) && ret != nvml.ERROR_INVALID_ARGUMENT {
				// Try again next round rather than decide on an error.
				g.mu.Unlock()
				_, err := rd.check(ReadingNVLink, ret)
				return err
			}
			break
		}
		g.linksScanned = true
	}
	links := g.links
	g.mu.Unlock()
	if len(links) == 0 {
		rd.r.Unsupported = append(rd.r.Unsupported, ReadingNVLink)
		return nil
	}
	for _, link := range links {
		state, ret := g.handle.GetNvLinkState(link)
		ok, err := rd.check(fmt.Sprintf("%s%d", ReadingNVLink, link), ret)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		l := NVLinkReading{Link: link, Down: state != nvml.FEATURE_ENABLED}
		var total uint64
		supported := false
		for _, c := range nvlinkCounters {
			v, ret := g.handle.GetNvLinkErrorCounter(link, c)
			switch {
			case ret == nvml.SUCCESS:
				total += v
				supported = true
			case lost(ret):
				return rd.lostNow()
			case notSupported(ret):
			default:
				rd.r.Errors = append(rd.r.Errors, nvmlError(fmt.Sprintf("reading NVLink %d error counter %d", link, c), ret).Error())
			}
		}
		if supported {
			l.Errors = &total
		}
		rd.r.NVLinks = append(rd.r.NVLinks, l)
	}
	return nil
}

// readRecoveryAction reads FI_DEV_GET_GPU_RECOVERY_ACTION. Drivers that predate the field
// answer NOT_SUPPORTED in the field's own return code.
func readRecoveryAction(h nvml.Device, rd reader) (health.RecoveryAction, bool, error) {
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION, ScopeId: 0}}
	ret := h.GetFieldValues(values)
	if ret == nvml.SUCCESS {
		ret = nvml.Return(values[0].NvmlReturn)
	}
	ok, err := rd.check(ReadingRecoveryAction, ret)
	if !ok || err != nil {
		return 0, false, err
	}
	v, known := fieldValue(values[0])
	if !known || v > math.MaxUint8 {
		rd.r.Errors = append(rd.r.Errors, fmt.Sprintf("reading %s: unexpected value type %d", ReadingRecoveryAction, values[0].ValueType))
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
