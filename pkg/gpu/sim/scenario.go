package sim

import (
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Scenario file identity.
const (
	APIVersion = "gpuhealth.dev/v1alpha1"
	Kind       = "Scenario"
)

// Limits on a scenario.
const (
	MaxGPUs         = 64
	MaxMIGInstances = 7
	MaxRepeat       = 10_000_000
	// MaxTotalRepeat bounds the signals all events of a scenario may produce (about ten
	// seconds of replay), and MaxDuration its length on virtual time.
	MaxTotalRepeat = 100_000_000
	MaxDuration    = 7 * 24 * time.Hour
	MaxNVLinks     = 18
	DefaultNode    = "sim-node"
	DefaultModel   = "NVIDIA H100 80GB HBM3"
)

// EventKind says what an Event does.
type EventKind string

// Event kinds, named after the scenario file's fields.
const (
	EventXID               EventKind = "xid"
	EventECC               EventKind = "ecc"
	EventRemappedRows      EventKind = "remappedRows"
	EventRetiredPages      EventKind = "retiredPages"
	EventTemperature       EventKind = "temperatureC"
	EventClockEventReasons EventKind = "clockEventReasons"
	EventPCIeReplays       EventKind = "pcieReplays"
	EventNVLink            EventKind = "nvlink"
	EventRecoveryAction    EventKind = "recoveryAction"
	EventLost              EventKind = "lost"
	EventReset             EventKind = "reset"
	EventReboot            EventKind = "reboot"
	// EventKmsg is a kernel-log line, parsed by pkg/gpu/kmsg as the agent parses /dev/kmsg.
	EventKmsg EventKind = "kmsg"
	// EventFabric sets the GPU's NVLink fabric registration as Fabric Manager reports it
	// (nvmlDeviceGetGpuFabricInfoV): Fabric's state, status and health flags.
	EventFabric EventKind = "fabric"
	// EventRowRemapHistogram sets the row remapper's banks with few (BanksLow) and no
	// (BanksNone) spare rows left.
	EventRowRemapHistogram EventKind = "rowRemapHistogram"
	// EventSRAM sets whether the SRAM ECC errors exceeded the driver's threshold.
	EventSRAM EventKind = "sramThresholdExceeded"
	// EventPCIeLink retrains the PCIe link: PCIeLink's non-zero fields replace the GPU's.
	EventPCIeLink EventKind = "pcieLink"
	// EventNVLinkRecoveries adds to a link's lifetime recovery counts (successful, failed).
	EventNVLinkRecoveries EventKind = "nvlinkRecoveries"

	// Events only a driver can answer: the simulated driver (gpuhealth sim-driver serve) serves
	// them; the sim backend, which reads no NVML, refuses them (ParseScenario) so that no
	// scenario means less than it says.

	// EventDriver unloads the driver or loads it again (DriverAction "unload" or "load").
	EventDriver EventKind = "driver"
	// EventHang makes every NVML call on the GPU hang for Hang (a wedged GPU).
	EventHang EventKind = "hang"
	// EventOutOfRange makes the next read of Reading answer a value no GPU can have (a
	// temperature of 4,294,967,295 °C).
	EventOutOfRange EventKind = "outOfRange"
	// EventReadsLower makes the next read of the counter Reading answer less than the last one
	// did (0), once: a glitch, not a reset.
	EventReadsLower EventKind = "readsLower"
	// EventMIG changes the GPU's MIG layout at run time (MIGCount instances; 0 turns MIG mode
	// off), as mig-parted or nvidia-smi mig do, and sends NVML's MIG configuration-change event.
	EventMIG EventKind = "migInstances"
)

// DriverOnly reports whether events of kind k are answered by the simulated driver only.
func (k EventKind) DriverOnly() bool {
	switch k {
	case EventDriver, EventHang, EventOutOfRange, EventReadsLower, EventMIG:
		return true
	}
	return false
}

// Driver actions of an EventDriver.
const (
	DriverUnload = "unload"
	DriverLoad   = "load"
)

// Fabric states of an EventFabric, as NVML_GPU_FABRIC_STATE_* names them.
const (
	FabricNotStarted = "notStarted"
	FabricInProgress = "inProgress"
	FabricCompleted  = "completed"
)

// FabricStates lists the fabric states an EventFabric may set.
var FabricStates = []string{FabricNotStarted, FabricInProgress, FabricCompleted}

// MaxHang is the longest a hang event may make calls wait.
const MaxHang = 10 * time.Minute

// Readings that outOfRange and readsLower events name.
var (
	OutOfRangeReadings = []string{"temperature", "ecc", "power", "pcieReplays", "pcieLink", "rowRemapHistogram"}
	ReadsLowerReadings = []string{"ecc", "pcieReplays"}
)

// Scenario is a parsed scenario file: simulated GPUs and a timeline of faults and repairs.
type Scenario struct {
	Node         string
	GPUCount     int
	Model        string
	MIGInstances map[int]int
	// Missing are the GPUs on the PCI bus that the driver does not answer for (gpus.missing):
	// the backend has no device for them, and only kernel-log lines can name them.
	Missing map[int]bool
	// Serials are the board serials the scenario gives (gpus.serials), by GPU index; the GPUs
	// after the list's end take DefaultSerial. Serial answers for any GPU.
	Serials []string
	// VBIOS is the VBIOS version of every GPU of the node (gpus.vbios, DefaultVBIOS when the file
	// gives none); MIG instances have none.
	VBIOS string
	// Duration, when set, is where the replay ends; otherwise it ends a settling time after the
	// last event (see Options.Settle).
	Duration time.Duration
	// Events are sorted by At, ties in file order.
	Events []Event
	// AfterReset are the events that happen again each time their GPU is reset (by a reset
	// event or through Backend.Reset), their At after the reset: a fault a reset does not cure.
	AfterReset []Event
}

// OnNode returns a copy of the scenario replayed on node instead of sc.Node: the GPUs' (and MIG
// instances') UUIDs, the default serials and the boot IDs derive from node (the serials the file
// gives are kept: see Serial). Events keep their meaning, as the GPUs
// they name were resolved to indexes when the scenario was parsed. A DaemonSet whose pods all
// replay one scenario gives each node its own devices this way.
func (sc *Scenario) OnNode(node string) *Scenario {
	c := *sc
	c.Node = node
	return &c
}

// Event is one step of a scenario. Only the fields of its Kind are meaningful.
type Event struct {
	At   time.Duration
	Line int
	Kind EventKind
	// GPU is the index of the GPU concerned (-1 for a node-wide event: reboot); for a kmsg
	// event, the GPU its line names.
	GPU int
	// MIG is the 1-based position of the MIG instance the event targets (0 for the whole GPU).
	MIG    int
	Repeat int

	XID uint32
	// XIDFlags qualify an XID as the driver does for NVLink5 XIDs (xidSeverity,
	// causedByPrevious).
	XIDFlags            health.XIDFlags
	GPUInstance         *uint32
	ComputeInstance     *uint32
	CorrectedIncrease   uint64
	UncorrectedIncrease uint64
	RowsPending         *bool
	RowsFailure         *bool
	PagesPending        bool
	TemperatureC        int64
	ClockEventReasons   health.ClockEventReasons
	PCIeReplaysIncrease int64
	Link                uint32
	LinkDown            *bool
	LinkErrorsIncrease  int64
	RecoveryAction      health.RecoveryAction
	// Kmsg is the kernel-log record of an EventKmsg: a message logged by the kernel, or a
	// whole /dev/kmsg record ("3,1042,4909922970,-;NVRM: ..."), whose facility then counts.
	Kmsg kmsg.Record
	// Fabric is an EventFabric's registration: state, status and health flags.
	Fabric health.FabricReading
	// BanksLow and BanksNone are an EventRowRemapHistogram's; SRAMThresholdExceeded an
	// EventSRAM's; PCIeLink an EventPCIeLink's (zero fields keep the GPU's);
	// RecoveriesSuccessful and RecoveriesFailed an EventNVLinkRecoveries' increases of Link's
	// counts.
	BanksLow, BanksNone                    uint32
	SRAMThresholdExceeded                  bool
	PCIeLink                               health.PCIeLinkReading
	RecoveriesSuccessful, RecoveriesFailed uint64
	// DriverAction is DriverUnload or DriverLoad (EventDriver); Hang how long calls hang
	// (EventHang); Reading the reading an EventOutOfRange or EventReadsLower concerns.
	DriverAction string
	Hang         time.Duration
	Reading      string
	// MIGCount is the GPU's number of MIG instances after an EventMIG (0: MIG mode off).
	MIGCount int
	// Peer is an EventPeerFault's fault (its Since is the event's time); PeerCleared says the
	// peer no longer reports it.
	Peer        health.PeerFault
	PeerCleared bool
	// LatentXID is an EventLatent's fault: the XID a diagnostic under load finds; Diag is an
	// EventDiag's word (diag.go).
	LatentXID uint32
	Diag      DiagWord
}

// End is where a replay of the scenario stops: Duration when set, else settle after the last
// event, so that hysteresis windows that the last events opened can close.
func (sc *Scenario) End(settle time.Duration) time.Duration {
	if sc.Duration > 0 {
		return sc.Duration
	}
	if len(sc.Events) == 0 {
		return settle
	}
	return sc.Events[len(sc.Events)-1].At + settle
}

// GPUUUID is the stable UUID of simulated GPU index on node, shaped like NVML's.
func GPUUUID(node string, index int) string {
	return "GPU-" + uuidFrom(fmt.Sprintf("%s/gpu/%d", node, index))
}

// MIGUUID is the stable UUID of the n-th (1-based) MIG instance of GPU index on node.
func MIGUUID(node string, index, n int) string {
	return "MIG-" + uuidFrom(fmt.Sprintf("%s/gpu/%d/mig/%d", node, index, n))
}

func uuidFrom(seed string) string {
	h := sha256.Sum256([]byte(seed))
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// Devices returns the scenario's GPUs and MIG instances with realistic attributes.
func (sc *Scenario) Devices() []health.Device {
	var devs []health.Device
	for i := range sc.GPUCount {
		if sc.Missing[i] {
			continue
		}
		gpu := health.Device{
			UUID:     GPUUUID(sc.Node, i),
			Index:    i,
			PCIBusID: PCIBusID(i),
			Minor:    i,
			Model:    sc.Model,
			Serial:   sc.Serial(i),
			VBIOS:    sc.VBIOS,
		}
		devs = append(devs, gpu)
		for m := 1; m <= sc.MIGInstances[i]; m++ {
			devs = append(devs, health.Device{
				UUID:  MIGUUID(sc.Node, i, m),
				Index: i,
				Minor: i,
				Model: sc.Model + " MIG",
				MIG:   &health.MIGPlacement{ParentUUID: gpu.UUID, GPUInstance: uint32(m), ComputeInstance: 0},
			})
		}
	}
	return devs
}

// OnBus returns the PCI addresses of every GPU of the scenario, those in gpus.missing included,
// in sysfs's form (0000:10:00.0): what the node's PCI bus holds.
func (sc *Scenario) OnBus() []string {
	out := make([]string, sc.GPUCount)
	for i := range out {
		out[i], _ = health.NormalizePCIBusID(PCIBusID(i))
	}
	return out
}

// PCIBusID is the PCI address of simulated GPU index as NVML writes it (00000000:10:00.0): GPU i
// sits on bus 0x10+i, on every simulated node and in the simulated driver alike.
func PCIBusID(index int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x10+index) }

// Placeholders returns the placeholder devices of the GPUs in gpus.missing
// (health.MissingGPUs).
func (sc *Scenario) Placeholders() []health.Device {
	return health.MissingGPUs(sc.Devices(), sc.OnBus(), 0)
}
