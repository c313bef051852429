package sim

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"

	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The early warnings in the scenario format: the NVLink fabric registration (a state, or state,
// status and health flags), the row remapper histogram, the SRAM ECC threshold, the PCIe link and
// NVLink recoveries.

var fabricStates = map[string]health.FabricState{
	FabricNotStarted: health.FabricNotStarted, FabricInProgress: health.FabricInProgress, FabricCompleted: health.FabricCompleted,
}

// FabricHealthFlags lists the fabric health flags an EventFabric may set, as nvml.h's
// NVML_GPU_FABRIC_HEALTH_MASK_* name them.
var FabricHealthFlags = []string{"degradedBandwidth", "routeRecovery", "routeUnhealthy", "accessTimeoutRecovery"}

// MaxFabricStatus bounds a fabric registration's status, an nvmlReturn_t (NVML_ERROR_UNKNOWN is
// 999).
const MaxFabricStatus = 999

// The simulated GPUs' row remapper and PCIe link.
const (
	// RemapBanks is how many banks a simulated GPU's row remapper has.
	RemapBanks = 640
	// PCIeGen and PCIeWidth are a simulated GPU's PCIe link: gen 5 x16, the most it can.
	PCIeGen   = 5
	PCIeWidth = 16
	// MaxPCIeGen is the highest PCIe generation a scenario may train a link to.
	MaxPCIeGen = 6
)

// PCIeWidths are the link widths PCIe has.
var PCIeWidths = []uint8{1, 2, 4, 8, 12, 16, 32}

type histogramSpec struct {
	Low  *uint32 `yaml:"low"`
	None *uint32 `yaml:"none"`
}

type pcieLinkSpec struct {
	Gen      *uint8 `yaml:"gen"`
	MaxGen   *uint8 `yaml:"maxGen"`
	Width    *uint8 `yaml:"width"`
	MaxWidth *uint8 `yaml:"maxWidth"`
}

type recoveriesSpec struct {
	Link       *uint32 `yaml:"link"`
	Successful *uint64 `yaml:"successful"`
	Failed     *uint64 `yaml:"failed"`
}

// fabricSpec is a fabric event's value: a state ("inProgress"), or a mapping of state, status
// (an nvmlReturn_t) and health flags. It decodes itself, as strictly as the rest of the file.
type fabricSpec struct {
	State  string
	Status uint32
	Health []string
}

func (f *fabricSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	shape := fmt.Errorf("line %d: fabric must be a state (%s) or a mapping of state, status and health", n.Line, strings.Join(FabricStates, ", "))
	switch n.Kind {
	case yaml.ScalarNode:
		if n.ShortTag() != "!!str" {
			return shape
		}
		f.State = n.Value
		return nil
	case yaml.MappingNode:
	default:
		return shape
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if v.Kind == yaml.AliasNode && v.Alias != nil {
			v = v.Alias
		}
		if seen[k.Value] {
			return fmt.Errorf("line %d: fabric: %s given twice", k.Line, k.Value)
		}
		seen[k.Value] = true
		switch k.Value {
		case "state":
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
				return fmt.Errorf("line %d: fabric.state: must be one of %s", v.Line, strings.Join(FabricStates, ", "))
			}
			f.State = v.Value
		case "status":
			st, err := strconv.ParseUint(v.Value, 10, 32)
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || err != nil || st > MaxFabricStatus {
				return fmt.Errorf("line %d: fabric.status: must be an nvmlReturn_t from 0 (success) to %d, got %q", v.Line, MaxFabricStatus, v.Value)
			}
			f.Status = uint32(st)
		case "health":
			if v.Kind != yaml.SequenceNode {
				return fmt.Errorf("line %d: fabric.health: must be a list of %s", v.Line, strings.Join(FabricHealthFlags, ", "))
			}
			for _, h := range v.Content {
				if h.Kind != yaml.ScalarNode || !slices.Contains(FabricHealthFlags, h.Value) {
					return fmt.Errorf("line %d: fabric.health: %q is none of %s", h.Line, h.Value, strings.Join(FabricHealthFlags, ", "))
				}
				f.Health = append(f.Health, h.Value)
			}
		default:
			return fmt.Errorf("line %d: fabric: unknown field %q (want state, status, health)", k.Line, k.Value)
		}
	}
	if f.State == "" {
		return fmt.Errorf("line %d: fabric.state: required (%s)", n.Line, strings.Join(FabricStates, ", "))
	}
	return nil
}

// earlyWarningEvent checks an early-warning event and fills ev.
func earlyWarningEvent(spec eventSpec, ev *Event) error {
	switch ev.Kind {
	case EventFabric:
		return fabricEvent(*spec.Fabric, ev)
	case EventRowRemapHistogram:
		h := spec.RowRemapHistogram
		if h.Low == nil && h.None == nil {
			return errors.New("rowRemapHistogram: set low or none (banks with few or no spare rows left; what is absent is 0)")
		}
		if h.Low != nil {
			ev.BanksLow = *h.Low
		}
		if h.None != nil {
			ev.BanksNone = *h.None
		}
		if uint64(ev.BanksLow)+uint64(ev.BanksNone) > RemapBanks {
			return fmt.Errorf("rowRemapHistogram: %d low and %d none is more than the %d banks a simulated GPU has", ev.BanksLow, ev.BanksNone, RemapBanks)
		}
	case EventSRAM:
		ev.SRAMThresholdExceeded = *spec.SRAMExceeded
	case EventPCIeLink:
		return pcieLinkEvent(*spec.PCIeLink, ev)
	case EventNVLinkRecoveries:
		r := spec.NVLinkRecoveries
		switch {
		case r.Link == nil:
			return errors.New("nvlinkRecoveries.link: required")
		case *r.Link >= MaxNVLinks:
			return fmt.Errorf("nvlinkRecoveries.link: must be below %d, got %d", MaxNVLinks, *r.Link)
		case r.Successful == nil && r.Failed == nil:
			return errors.New("nvlinkRecoveries: set successful or failed (an increase of the link's recovery count)")
		}
		ev.Link = *r.Link
		if r.Successful != nil {
			ev.RecoveriesSuccessful = *r.Successful
		}
		if r.Failed != nil {
			ev.RecoveriesFailed = *r.Failed
		}
		if ev.RecoveriesSuccessful > maxRecoveriesIncrease || ev.RecoveriesFailed > maxRecoveriesIncrease {
			return fmt.Errorf("nvlinkRecoveries: an increase of at most %d", maxRecoveriesIncrease)
		}
	}
	return nil
}

// maxRecoveriesIncrease bounds one event's increase of an NVLink recovery count, far below
// where NVML's counts stop being believed (pkg/gpu/nvml's MaxPlausibleNVLinkRecoveries, 2^32).
const maxRecoveriesIncrease = 1_000_000

// fabricEvent checks a fabric event's state, status and health flags.
func fabricEvent(f fabricSpec, ev *Event) error {
	state, ok := fabricStates[f.State]
	if !ok {
		return fmt.Errorf("fabric: must be one of %s, got %q", strings.Join(FabricStates, ", "), f.State)
	}
	if f.Status != 0 && state != health.FabricCompleted {
		return fmt.Errorf("fabric.status: only a completed registration has a status (the state is %s)", f.State)
	}
	ev.Fabric = health.FabricReading{State: state, Status: f.Status}
	for _, h := range f.Health {
		switch h {
		case "degradedBandwidth":
			ev.Fabric.DegradedBandwidth = true
		case "routeRecovery":
			ev.Fabric.RouteRecovery = true
		case "routeUnhealthy":
			ev.Fabric.RouteUnhealthy = true
		case "accessTimeoutRecovery":
			ev.Fabric.AccessTimeoutRecovery = true
		}
	}
	return nil
}

// pcieLinkEvent checks a pcieLink event: generations 1 to MaxPCIeGen, widths PCIe has, and a
// link trained at most as fast and as wide as the maximum given with it.
func pcieLinkEvent(l pcieLinkSpec, ev *Event) error {
	if l.Gen == nil && l.MaxGen == nil && l.Width == nil && l.MaxWidth == nil {
		return errors.New("pcieLink: set gen, maxGen, width or maxWidth (what is absent stays as it was)")
	}
	for _, f := range []struct {
		name  string
		v     *uint8
		into  *uint8
		width bool
	}{
		{"gen", l.Gen, &ev.PCIeLink.Gen, false}, {"maxGen", l.MaxGen, &ev.PCIeLink.MaxGen, false},
		{"width", l.Width, &ev.PCIeLink.Width, true}, {"maxWidth", l.MaxWidth, &ev.PCIeLink.MaxWidth, true},
	} {
		switch {
		case f.v == nil:
			continue
		case !f.width && (*f.v < 1 || *f.v > MaxPCIeGen):
			return fmt.Errorf("pcieLink.%s: must be a PCIe generation from 1 to %d, got %d", f.name, MaxPCIeGen, *f.v)
		case f.width && !slices.Contains(PCIeWidths, *f.v):
			return fmt.Errorf("pcieLink.%s: must be a PCIe link width (1, 2, 4, 8, 12, 16 or 32), got %d", f.name, *f.v)
		}
		*f.into = *f.v
	}
	p := ev.PCIeLink
	if p.Gen > 0 && p.MaxGen > 0 && p.Gen > p.MaxGen || p.Width > 0 && p.MaxWidth > 0 && p.Width > p.MaxWidth {
		return fmt.Errorf("pcieLink: gen %d x%d is more than the most the link can (gen %d x%d)", p.Gen, p.Width, p.MaxGen, p.MaxWidth)
	}
	return nil
}

// The sim backend's early warnings.

// earlySeen says which early-warning readings a GPU's scenario events concern.
type earlySeen struct{ fabric, histogram, sram, pcie bool }

// seeEarlyWarnings marks the early warnings each GPU's events concern (they are sampled from the
// first round on) and gives every GPU the readings of a fresh boot.
func (b *Backend) seeEarlyWarnings() {
	for _, ev := range append(slices.Clone(b.sc.Events), b.sc.AfterReset...) {
		if ev.GPU < 0 {
			continue
		}
		g := b.gpus[ev.GPU]
		switch ev.Kind {
		case EventFabric:
			g.seen.fabric = true
		case EventRowRemapHistogram:
			g.seen.histogram = true
		case EventSRAM:
			g.seen.sram = true
		case EventPCIeLink:
			g.seen.pcie = true
		case EventNVLinkRecoveries:
			g.recoveriesSeen |= 1 << ev.Link
		}
	}
	for _, g := range b.gpus {
		g.idleEarlyWarnings()
	}
}

// applyEarlyWarning changes an early-warning reading and reports it at once; a recovery count,
// polled only, shows in the next round.
func (g *gpuState) applyEarlyWarning(ev Event, base health.Signal, sink gpu.Sink) {
	switch ev.Kind {
	case EventFabric:
		g.fabric = ev.Fabric
		sink.Signal(g.fabricSignal(base))
	case EventRowRemapHistogram:
		g.banksLow, g.banksNone = ev.BanksLow, ev.BanksNone
		sink.Signal(g.histogramSignal(base))
	case EventSRAM:
		g.sramExceeded = ev.SRAMThresholdExceeded
		sink.Signal(g.sramSignal(base))
	case EventPCIeLink:
		for _, f := range [...]struct{ from, into *uint8 }{
			{&ev.PCIeLink.Gen, &g.pcie.Gen}, {&ev.PCIeLink.MaxGen, &g.pcie.MaxGen},
			{&ev.PCIeLink.Width, &g.pcie.Width}, {&ev.PCIeLink.MaxWidth, &g.pcie.MaxWidth},
		} {
			if *f.from != 0 {
				*f.into = *f.from
			}
		}
		sink.Signal(g.pcieSignal(base))
	case EventNVLinkRecoveries:
		// Polled only: the next sampling round reports the new total.
		g.recoveries[ev.Link] += int64(ev.RecoveriesSuccessful + ev.RecoveriesFailed)
	}
}

// idleEarlyWarnings sets what a GPU fresh from a boot reports: a fabric registration that
// completed, a full row remapper, a PCIe link at its best. The row remapper's banks and the SRAM
// threshold are the GPU's own and stay.
func (g *gpuState) idleEarlyWarnings() {
	g.fabric = health.FabricReading{State: health.FabricCompleted}
	g.pcie = health.PCIeLinkReading{Gen: PCIeGen, MaxGen: PCIeGen, Width: PCIeWidth, MaxWidth: PCIeWidth}
	g.recoveries = [MaxNVLinks]int64{}
}

func (g *gpuState) fabricSignal(base health.Signal) health.Signal {
	base.Kind, base.Fabric = health.SignalFabric, g.fabric
	return base
}

func (g *gpuState) histogramSignal(base health.Signal) health.Signal {
	base.Kind, base.BanksLow, base.BanksNone = health.SignalRowRemapHistogram, g.banksLow, g.banksNone
	return base
}

func (g *gpuState) sramSignal(base health.Signal) health.Signal {
	base.Kind, base.Failure = health.SignalSRAMThreshold, g.sramExceeded
	return base
}

func (g *gpuState) pcieSignal(base health.Signal) health.Signal {
	base.Kind, base.PCIe = health.SignalPCIeLink, g.pcie
	return base
}
