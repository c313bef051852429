package nvml

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The early warnings: readings that say a GPU is running out of spares or margin before it
// fails (the row remapper's bank histogram, the SRAM ECC threshold, the PCIe link as trained,
// NVLink recoveries). Each is read once per sampling round. A check whose reading answers
// NOT_SUPPORTED, or gives a value no GPU can have, does not run on the GPU until a reading is
// taken again (Readings.checks; the sampler tells the sink).

// RowRemapHistogramReading is the row remapper's bank availability histogram
// (nvmlDeviceGetRowRemapperHistogram): how many banks have all, many, some, few and no spare
// rows left.
type RowRemapHistogramReading struct {
	Max     uint32 `json:"max"`
	High    uint32 `json:"high"`
	Partial uint32 `json:"partial"`
	Low     uint32 `json:"low"`
	None    uint32 `json:"none"`
}

// SRAMReading is the SRAM ECC error status (nvmlDeviceGetSramEccErrorStatus).
type SRAMReading struct {
	// ThresholdExceeded is the driver's bThresholdExceeded: the SRAM errors passed the
	// threshold past which NVIDIA asks for the GPU to be replaced.
	ThresholdExceeded bool `json:"thresholdExceeded"`
	// AggregateUncorrected (parity and SEC-DED) and AggregateCorrected are lifetime counts,
	// shown by probe only.
	AggregateUncorrected uint64 `json:"aggregateUncorrected"`
	AggregateCorrected   uint64 `json:"aggregateCorrected"`
}

// PCIeLinkReading is the PCIe link as trained and the most it can train to in this system
// (0: unknown).
type PCIeLinkReading struct {
	Gen      int `json:"gen"`
	MaxGen   int `json:"maxGen,omitempty"`
	Width    int `json:"width"`
	MaxWidth int `json:"maxWidth,omitempty"`
}

// NVLinkRecoveryReading is one NVLink's lifetime count of link recoveries, from the field values
// NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS and _FAILED_EVENTS.
type NVLinkRecoveryReading struct {
	Link       int    `json:"link"`
	Successful uint64 `json:"successful"`
	Failed     uint64 `json:"failed"`
}

// Bounds on what is believed; a reading past one is a glitch of the driver and is dropped.
const (
	// MaxPlausiblePCIeLink bounds a PCIe generation and a link width (x32 is PCIe's widest).
	MaxPlausiblePCIeLink = 32
	// MaxPlausibleRemapBanks bounds the banks the row remapper histogram counts, all buckets
	// together (an HBM GPU has thousands).
	MaxPlausibleRemapBanks = 1 << 16
	// MaxPlausibleNVLinkRecoveries bounds a link's lifetime recovery count: a recovery takes
	// milliseconds, and a link that recovered billions of times is a glitch.
	MaxPlausibleNVLinkRecoveries = 1 << 32
)

// readRowRemapHistogram reads the row remapper's bank histogram. A GPU without a row remapper
// (before Ampere), or one in MIG mode, answers NOT_SUPPORTED: the check does not run there.
func (b *Backend) readRowRemapHistogram(g *gpu, rd reader) error {
	if rd.off(g, ReadingRowRemapHistogram) {
		return nil
	}
	h, ret := g.handle.GetRowRemapperHistogram()
	if ok, err := b.checkRet(rd, ReadingRowRemapHistogram, health.CheckRowRemapHistogram, ret); !ok || err != nil {
		return err
	}
	if total := uint64(h.Max) + uint64(h.High) + uint64(h.Partial) + uint64(h.Low) + uint64(h.None); total > MaxPlausibleRemapBanks {
		b.implausible(rd, ReadingRowRemapHistogram, health.CheckRowRemapHistogram, fmt.Sprintf("%d banks (max %d, high %d, partial %d, low %d, none %d; at most %d believed)",
			total, h.Max, h.High, h.Partial, h.Low, h.None, MaxPlausibleRemapBanks))
		return nil
	}
	rd.r.RowRemapHistogram = &RowRemapHistogramReading{Max: h.Max, High: h.High, Partial: h.Partial, Low: h.Low, None: h.None}
	rd.checked(health.CheckRowRemapHistogram, false)
	return nil
}

// readSRAM reads the SRAM ECC error status (nvml.h: Ampere and later; root only). Without root
// the call answers NO_PERMISSION: the check does not run, as where the GPU does not support it.
func (b *Backend) readSRAM(g *gpu, rd reader) error {
	if rd.off(g, ReadingSRAM) {
		return nil
	}
	st, ret := g.handle.GetSramEccErrorStatus()
	if ret == nvml.ERROR_NO_PERMISSION {
		ret = nvml.ERROR_NOT_SUPPORTED
	}
	if ok, err := b.checkRet(rd, ReadingSRAM, health.CheckSRAM, ret); !ok || err != nil {
		return err
	}
	if st.BThresholdExceeded > 1 {
		b.implausible(rd, ReadingSRAM, health.CheckSRAM, fmt.Sprintf("threshold-exceeded flag %d is neither 0 nor 1", st.BThresholdExceeded))
		return nil
	}
	rd.r.SRAM = &SRAMReading{
		ThresholdExceeded:    st.BThresholdExceeded == 1,
		AggregateUncorrected: st.AggregateUncParity + st.AggregateUncSecDed,
		AggregateCorrected:   st.AggregateCor,
	}
	rd.checked(health.CheckSRAM, false)
	return nil
}

// readPCIeLink reads the PCIe link's current width and generation and the most this GPU can
// train to in this system: nvmlDeviceGetMaxPcieLinkGeneration and …Width say what "this device
// and system" allow (a Gen5 GPU in a Gen4 slot: 4), so a GPU in a slower slot is not degraded.
// A driver without the former has its generation compared with the GPU's own maximum
// (nvmlDeviceGetGpuMaxPcieLinkGeneration). A maximum that cannot be read is 0, unknown.
func (b *Backend) readPCIeLink(g *gpu, rd reader) error {
	if rd.off(g, ReadingPCIeLink) {
		return nil
	}
	width, ret := g.handle.GetCurrPcieLinkWidth()
	if ok, err := b.checkRet(rd, ReadingPCIeLink, health.CheckPCIeLink, ret); !ok || err != nil {
		return err
	}
	l := PCIeLinkReading{Width: width}
	maxGen := g.handle.GetMaxPcieLinkGeneration
	if !b.sym.has(symMaxPcieLinkGeneration) {
		maxGen = g.handle.GetGpuMaxPcieLinkGeneration
	}
	for _, part := range [...]struct {
		name string
		has  bool
		read func() (int, nvml.Return)
		into *int
	}{
		{"current PCIe link generation", b.sym.has(symCurrPcieLinkGeneration), g.handle.GetCurrPcieLinkGeneration, &l.Gen},
		{"maximum PCIe link generation", b.sym.has(symMaxPcieLinkGeneration) || b.sym.has(symGpuMaxPcieLinkGeneration), maxGen, &l.MaxGen},
		{"maximum PCIe link width", b.sym.has(symMaxPcieLinkWidth), g.handle.GetMaxPcieLinkWidth, &l.MaxWidth},
	} {
		if !part.has {
			continue
		}
		v, ret := part.read()
		switch {
		case ret == nvml.SUCCESS:
			*part.into = v
		case notSupported(ret):
		default:
			if err := rd.broken(part.name, ret); err != nil {
				return err
			}
			rd.r.Errors = append(rd.r.Errors, nvmlError("reading the "+part.name, ret).Error())
		}
	}
	for _, v := range [...]int{l.Gen, l.MaxGen, l.Width, l.MaxWidth} {
		if v < 0 || v > MaxPlausiblePCIeLink {
			b.implausible(rd, ReadingPCIeLink, health.CheckPCIeLink, fmt.Sprintf("gen %d x%d of gen %d x%d (at most %d believed)", l.Gen, l.Width, l.MaxGen, l.MaxWidth, MaxPlausiblePCIeLink))
			return nil
		}
	}
	rd.r.PCIeLink = &l
	rd.checked(health.CheckPCIeLink, false)
	return nil
}

// The field values of a link's recovery count.
var nvlinkRecoveryFields = [...]uint32{nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS, nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS}

// readNVLinkRecoveries reads the recovery counts of the links read this round, in one
// nvmlDeviceGetFieldValues call (the link is the field's scope). A GPU without watched links
// has nothing to count, and no data (like the nvlink reading); a driver that predates the
// fields answers NOT_SUPPORTED (or INVALID_ARGUMENT) in each field's own return code: the check
// does not run.
func (b *Backend) readNVLinkRecoveries(g *gpu, rd reader) error {
	if rd.off(g, ReadingNVLinkRecoveries) || len(rd.r.NVLinks) == 0 {
		return nil
	}
	values := make([]nvml.FieldValue, 0, len(nvlinkRecoveryFields)*len(rd.r.NVLinks))
	for _, l := range rd.r.NVLinks {
		for _, id := range nvlinkRecoveryFields {
			values = append(values, nvml.FieldValue{FieldId: id, ScopeId: uint32(l.Link)})
		}
	}
	if ok, err := b.checkRet(rd, ReadingNVLinkRecoveries, health.CheckNVLinkRecoveries, g.handle.GetFieldValues(values)); !ok || err != nil {
		return err
	}
	var out []NVLinkRecoveryReading
	unsupported := 0
	for i, l := range rd.r.NVLinks {
		link := NVLinkRecoveryReading{Link: l.Link}
		counts := [...]*uint64{&link.Successful, &link.Failed}
		complete, supported := true, true
		for j, into := range counts {
			f := values[i*len(counts)+j]
			switch ret := nvml.Return(f.NvmlReturn); {
			case ret == nvml.SUCCESS:
				v, known := fieldValue(f)
				if !known || v > MaxPlausibleNVLinkRecoveries {
					b.implausible(rd, ReadingNVLinkRecoveries, health.CheckNVLinkRecoveries, fmt.Sprintf("NVLink %d field %d: value type %d, value %d (at most %d believed)", l.Link, f.FieldId, f.ValueType, v, uint64(MaxPlausibleNVLinkRecoveries)))
					return nil
				}
				*into = v
			case notSupported(ret), ret == nvml.ERROR_INVALID_ARGUMENT:
				complete, supported = false, false
			default:
				if err := rd.broken(fmt.Sprintf("NVLink %d recovery count", l.Link), ret); err != nil {
					return err
				}
				rd.r.Errors = append(rd.r.Errors, nvmlError(fmt.Sprintf("reading NVLink %d field %d", l.Link, f.FieldId), ret).Error())
				complete = false
			}
		}
		switch {
		case complete:
			out = append(out, link)
		case !supported:
			unsupported++
		}
	}
	switch {
	case unsupported == len(rd.r.NVLinks):
		rd.r.Unsupported = append(rd.r.Unsupported, ReadingNVLinkRecoveries)
		rd.checked(health.CheckNVLinkRecoveries, true)
		return nil
	case len(out) == 0:
		return nil // failed: the errors say why
	}
	rd.r.NVLinkRecoveries = out
	rd.checked(health.CheckNVLinkRecoveries, false)
	return nil
}

// checkRet is reader.check for a reading whose check the sampler marks round by round: a
// NOT_SUPPORTED answer also says the check does not run.
func (b *Backend) checkRet(rd reader, reading string, check health.Check, ret nvml.Return) (bool, error) {
	ok, err := rd.check(reading, ret)
	if !ok && err == nil && notSupported(ret) {
		rd.checked(check, true)
	}
	return ok, err
}
