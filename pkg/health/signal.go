package health

import (
	"fmt"
	"strings"
	"time"
)

// SignalKind says which fact a Signal carries and so which of its fields are meaningful.
type SignalKind uint8

const (
	// SignalXID: an XID critical error. Fields: XID, and MIGScoped, GPUInstance,
	// ComputeInstance for an XID that NVML attributes to one MIG instance.
	SignalXID SignalKind = iota + 1
	// SignalECCCounters: the volatile ECC totals. Fields: Corrected, Uncorrected.
	SignalECCCounters
	// SignalECCStorm: the driver reported a single-bit ECC storm (an event, no fields).
	SignalECCStorm
	// SignalRemappedRows: row remapper state. Fields: Pending, Failure.
	SignalRemappedRows
	// SignalRetiredPages: page retirement state. Fields: Pending.
	SignalRetiredPages
	// SignalTemperature: a temperature reading. Fields: Value (°C), SlowdownC, ShutdownC (the
	// device's own thresholds; zero when unknown).
	SignalTemperature
	// SignalClockEvents: the active clock-event (throttle) reasons. Fields: Reasons.
	SignalClockEvents
	// SignalPCIeReplays: the PCIe replay counter total. Fields: Value.
	SignalPCIeReplays
	// SignalNVLinkState: one NVLink's state. Fields: Link, Down.
	SignalNVLinkState
	// SignalNVLinkErrors: one NVLink's error counter total (CRC and replay). Fields: Link, Value.
	SignalNVLinkErrors
	// SignalRecoveryAction: NVML's GPU recovery action. Fields: Action.
	SignalRecoveryAction
	// SignalLost: the GPU is lost (fell off the bus, GPU_IS_LOST). No fields.
	SignalLost
	// SignalReset: the GPU was reset; Inferred when the backend only concluded it from volatile
	// counters that went back to (near) zero, which clears only what those counters said.
	SignalReset
	// SignalSample marks the end of one periodic sampling round for the device; the Tracker
	// uses it to expire quiet periods. No fields.
	SignalSample
	// SignalResetRequired: the GPU needs a reset before it can be used again (NVML answered
	// ERROR_RESET_REQUIRED). No fields. It comes after SignalSample so that the older kinds keep
	// their values.
	SignalResetRequired
	// SignalFabric: the GPU's NVLink fabric registration (Fabric Manager, NVL systems).
	// Fields: Fabric.
	SignalFabric
	// SignalRowRemapHistogram: the row remapper's bank availability histogram. Fields:
	// BanksLow, BanksNone (banks with little and with no spare rows left).
	SignalRowRemapHistogram
	// SignalSRAMThreshold: the SRAM ECC error status (Hopper and later). Fields: Failure (the
	// driver's error threshold was exceeded).
	SignalSRAMThreshold
	// SignalPCIeLink: the PCIe link as trained. Fields: PCIe.
	SignalPCIeLink
	// SignalNVLinkRecoveries: one NVLink's lifetime count of link recoveries. Fields: Link,
	// Value.
	SignalNVLinkRecoveries
)

var signalKindNames = [...]string{
	SignalXID: "xid", SignalECCCounters: "eccCounters", SignalECCStorm: "eccStorm",
	SignalRemappedRows: "remappedRows", SignalRetiredPages: "retiredPages",
	SignalTemperature: "temperature", SignalClockEvents: "clockEvents",
	SignalPCIeReplays: "pcieReplays", SignalNVLinkState: "nvlinkState",
	SignalNVLinkErrors: "nvlinkErrors", SignalRecoveryAction: "recoveryAction",
	SignalLost: "lost", SignalReset: "reset", SignalSample: "sample",
	SignalResetRequired: "resetRequired", SignalFabric: "fabric", SignalRowRemapHistogram: "rowRemapHistogram",
	SignalSRAMThreshold: "sramThreshold", SignalPCIeLink: "pcieLink", SignalNVLinkRecoveries: "nvlinkRecoveries",
}

func (k SignalKind) String() string {
	if int(k) < len(signalKindNames) && signalKindNames[k] != "" {
		return signalKindNames[k]
	}
	return fmt.Sprintf("SignalKind(%d)", uint8(k))
}

// ClockEventReasons is a bit set of clock-event (throttle) reasons. The bits match NVML's
// nvmlClocksEventReason values so the NVML backend can pass them through.
type ClockEventReasons uint64

// Clock-event reasons that the checks know by name.
const (
	ClockEventSWThermalSlowdown ClockEventReasons = 0x20
	ClockEventHWSlowdown        ClockEventReasons = 0x08
	ClockEventHWThermalSlowdown ClockEventReasons = 0x40
	ClockEventHWPowerBrake      ClockEventReasons = 0x80
)

var clockEventNames = []struct {
	bit  ClockEventReasons
	name string
}{
	{ClockEventHWSlowdown, "hwSlowdown"},
	{ClockEventHWThermalSlowdown, "hwThermalSlowdown"},
	{ClockEventHWPowerBrake, "hwPowerBrake"},
	{ClockEventSWThermalSlowdown, "swThermalSlowdown"},
}

// ParseClockEventReason parses one of hwSlowdown, hwThermalSlowdown, hwPowerBrake,
// swThermalSlowdown.
func ParseClockEventReason(s string) (ClockEventReasons, error) {
	for _, n := range clockEventNames {
		if n.name == s {
			return n.bit, nil
		}
	}
	return 0, fmt.Errorf("unknown clock event reason %q (want hwSlowdown, hwThermalSlowdown, hwPowerBrake or swThermalSlowdown)", s)
}

func (r ClockEventReasons) String() string {
	var names []string
	for _, n := range clockEventNames {
		if r&n.bit != 0 {
			names = append(names, n.name)
		}
	}
	if rest := r &^ (ClockEventHWSlowdown | ClockEventHWThermalSlowdown | ClockEventHWPowerBrake | ClockEventSWThermalSlowdown); rest != 0 {
		names = append(names, fmt.Sprintf("0x%x", uint64(rest)))
	}
	return strings.Join(names, ",")
}

// XIDFlags qualify an XID with what the driver said beside its code. NVLink5 XIDs (144-150, on
// Blackwell and later) carry a severity, the unit and the link they concern; XID 74 a fatal link;
// XID 45 the earlier XID that caused it (drivers 570.124.04 and later). Other XIDs carry none of
// this and their flags are zero.
type XIDFlags uint8

const (
	// XIDNonfatal: the driver classed the error Nonfatal. The XID's condition is then Degraded
	// at most, whatever its rule's severity: the GPU keeps working.
	XIDNonfatal XIDFlags = 1 << iota
	// XIDFatal: the driver classed the error Fatal. The rule's severity applies, as it does
	// when the driver said nothing.
	XIDFatal
	// XIDCausedByPrevious: the driver says an earlier XID caused this one. On a node where
	// another GPU has a fault of its own, the XID is attributed to that GPU (the root) and this
	// one is only Degraded, with a reason naming the root.
	XIDCausedByPrevious
	// XIDHasLink: Signal.Link names the NVLink the XID concerns.
	XIDHasLink
)

// Signal is one raw fact about a device, as a backend observed it. It is a plain value so that
// passing one costs no allocation; Kind says which fields are meaningful.
type Signal struct {
	Kind SignalKind
	// Device is the UUID of the GPU (or MIG instance) the fact is about.
	Device string
	// Time is when the fact was observed. The Tracker never reads a clock of its own.
	Time time.Time
	// MIGScoped limits an XID to one MIG GPU instance, and to one compute instance in it
	// unless ComputeInstance is NoInstance. Unscoped signals concern the whole GPU and every MIG
	// instance on it.
	MIGScoped       bool
	GPUInstance     uint32
	ComputeInstance uint32

	XID uint32
	// XIDFlags and Unit qualify an XID (see XIDFlags); Unit is the hardware unit the driver
	// named ("NETIR", "NVLW", ...), empty when it named none.
	XIDFlags XIDFlags
	Unit     string
	// CauseXID is the earlier XID the driver named as the cause (with XIDCausedByPrevious;
	// zero when it named none): the root is looked for among GPUs with that XID first.
	CauseXID    uint32
	Value       int64
	Corrected   uint64
	Uncorrected uint64
	SlowdownC   int64
	ShutdownC   int64
	Link        uint32
	Pending     bool
	Failure     bool
	Down        bool
	Reasons     ClockEventReasons
	Action      RecoveryAction
	// Fabric is a SignalFabric's reading; PCIe a SignalPCIeLink's.
	Fabric FabricReading
	PCIe   PCIeLinkReading
	// BanksLow and BanksNone are a SignalRowRemapHistogram's counts.
	BanksLow, BanksNone uint32
	// Inferred marks a SignalReset the backend concluded from the volatile ECC counters alone
	// (nobody it knows of reset the GPU): it clears the uncorrected-ECC condition and restarts the
	// counters' rates, but never an XID, a lost GPU, a reset the driver requires or anything else
	// only a real reset clears. A reset that really happens while a backend holds the GPU is
	// refused by the driver, so counters that go down under a watching backend are more likely a
	// glitch or a driver reload than a repair.
	Inferred bool
}

// XIDSignal builds an XID signal for the whole GPU.
func XIDSignal(uuid string, xid uint32, at time.Time) Signal {
	return Signal{Kind: SignalXID, Device: uuid, Time: at, XID: xid}
}

// FabricState is the GPU's NVLink fabric registration state, as NVML numbers it
// (NVML_GPU_FABRIC_STATE_*).
type FabricState uint8

// Fabric registration states.
const (
	FabricNotSupported FabricState = 0
	FabricNotStarted   FabricState = 1
	FabricInProgress   FabricState = 2
	FabricCompleted    FabricState = 3
)

// FabricReading is what NVML says of a GPU's fabric registration (nvmlGpuFabricInfo).
type FabricReading struct {
	State FabricState
	// Status is the registration's result once State is FabricCompleted: zero (NVML_SUCCESS)
	// when it succeeded, else the nvmlReturn_t it failed with.
	Status uint32
	// The health mask's bits, where the driver has them: bandwidth degraded, a route being
	// recovered, a route unhealthy, an access-timeout recovery in progress.
	DegradedBandwidth, RouteRecovery, RouteUnhealthy, AccessTimeoutRecovery bool
}

// PCIeLinkReading is the PCIe link as trained against the most it can train to. Zero means
// unknown.
type PCIeLinkReading struct {
	Gen, MaxGen, Width, MaxWidth uint8
}
