package sim

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/strictyaml"
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
// instances') UUIDs and the boot IDs derive from node. Events keep their meaning, as the GPUs
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

// scenarioFile mirrors the file; pointers tell "absent" from zero.
type scenarioFile struct {
	APIVersion string      `yaml:"apiVersion"`
	Kind       string      `yaml:"kind"`
	Node       string      `yaml:"node"`
	GPUs       *gpusSpec   `yaml:"gpus"`
	Duration   *duration   `yaml:"duration"`
	Events     []eventSpec `yaml:"events"`
}

type gpusSpec struct {
	Count        *int           `yaml:"count"`
	Model        string         `yaml:"model"`
	MIGInstances map[string]int `yaml:"migInstances"`
	Missing      []int          `yaml:"missing"`
}

type eventSpec struct {
	At              *duration `yaml:"at"`
	AfterReset      *duration `yaml:"afterReset"`
	GPU             *gpuRef   `yaml:"gpu"`
	Repeat          *int      `yaml:"repeat"`
	GPUInstance     *uint32   `yaml:"gpuInstance"`
	ComputeInstance *uint32   `yaml:"computeInstance"`

	XID               *uint32         `yaml:"xid"`
	XIDSeverity       *string         `yaml:"xidSeverity"`
	CausedByPrevious  *bool           `yaml:"causedByPrevious"`
	ECC               *eccSpec        `yaml:"ecc"`
	RemappedRows      *rowsSpec       `yaml:"remappedRows"`
	RetiredPages      *pagesSpec      `yaml:"retiredPages"`
	TemperatureC      *int64          `yaml:"temperatureC"`
	ClockEventReasons *[]string       `yaml:"clockEventReasons"`
	PCIeReplays       *int64          `yaml:"pcieReplays"`
	NVLink            *linkSpec       `yaml:"nvlink"`
	RecoveryAction    *string         `yaml:"recoveryAction"`
	Lost              *bool           `yaml:"lost"`
	Reset             *bool           `yaml:"reset"`
	Reboot            *bool           `yaml:"reboot"`
	Kmsg              *string         `yaml:"kmsg"`
	Driver            *string         `yaml:"driver"`
	Hang              *duration       `yaml:"hang"`
	OutOfRange        *string         `yaml:"outOfRange"`
	ReadsLower        *string         `yaml:"readsLower"`
	Fabric            *fabricSpec     `yaml:"fabric"`
	MIGInstances      *int            `yaml:"migInstances"`
	RowRemapHistogram *histogramSpec  `yaml:"rowRemapHistogram"`
	SRAMExceeded      *bool           `yaml:"sramThresholdExceeded"`
	PCIeLink          *pcieLinkSpec   `yaml:"pcieLink"`
	NVLinkRecoveries  *recoveriesSpec `yaml:"nvlinkRecoveries"`
	PeerFault         *peerFaultSpec  `yaml:"peerFault"`
	Latent            *latentSpec     `yaml:"latent"`
	Diag              *string         `yaml:"diag"`
}

type eccSpec struct {
	CorrectedVolatile   *uint64 `yaml:"correctedVolatile"`
	UncorrectedVolatile *uint64 `yaml:"uncorrectedVolatile"`
}

type rowsSpec struct {
	Pending *bool `yaml:"pending"`
	Failure *bool `yaml:"failure"`
}

type pagesSpec struct {
	Pending *bool `yaml:"pending"`
}

type linkSpec struct {
	Link      *uint32 `yaml:"link"`
	Down      *bool   `yaml:"down"`
	CRCErrors *int64  `yaml:"crcErrors"`
}

// duration is a Go duration string ("90s", "1h30m").
type duration = strictyaml.Duration

// gpuRef is a GPU index (an integer) or a UUID (a string).
type gpuRef struct {
	index int
	uuid  string
	line  int
}

func (g *gpuRef) UnmarshalYAML(n *yaml.Node) error {
	g.line = n.Line
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: gpu must be an index or a UUID", n.Line)
	}
	if i, err := strconv.Atoi(n.Value); err == nil {
		g.index = i
		return nil
	}
	if n.Tag == "!!int" || n.Value == "" {
		return fmt.Errorf("line %d: gpu %q is neither an index nor a UUID", n.Line, n.Value)
	}
	g.index, g.uuid = -1, n.Value
	return nil
}

// LoadScenario reads and parses a scenario file. Errors name the file.
func LoadScenario(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sc, err := ParseScenario(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

// LoadDriverScenario is LoadScenario for the simulated driver: it also takes the events only a
// driver can answer (EventKind.DriverOnly).
func LoadDriverScenario(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sc, err := parseScenario(data, true)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

// ParseScenario parses and validates a scenario for the sim backend. Errors are one line and
// name the line and the field. Events only a driver can answer are refused: the sim backend
// reads no NVML (ParseDriverScenario takes them).
func ParseScenario(data []byte) (*Scenario, error) { return parseScenario(data, false) }

// ParseDriverScenario is ParseScenario for the simulated driver, which also serves the events
// only a driver can answer.
func ParseDriverScenario(data []byte) (*Scenario, error) { return parseScenario(data, true) }

func parseScenario(data []byte, driver bool) (*Scenario, error) {
	var f scenarioFile
	if err := strictyaml.Decode(data, &f); err != nil {
		return nil, err
	}
	root, err := strictyaml.DecodeNode(data)
	if err != nil {
		return nil, err
	}
	if f.APIVersion != APIVersion {
		return nil, fmt.Errorf("apiVersion: must be %q, got %q", APIVersion, f.APIVersion)
	}
	if f.Kind != Kind {
		return nil, fmt.Errorf("kind: must be %q, got %q", Kind, f.Kind)
	}
	sc := &Scenario{Node: f.Node, Model: DefaultModel, MIGInstances: map[int]int{}}
	if sc.Node == "" {
		sc.Node = DefaultNode
	}
	if f.GPUs == nil || f.GPUs.Count == nil {
		return nil, errors.New("gpus.count: required")
	}
	sc.GPUCount = *f.GPUs.Count
	if sc.GPUCount < 1 || sc.GPUCount > MaxGPUs {
		return nil, fmt.Errorf("gpus.count: must be between 1 and %d, got %d", MaxGPUs, sc.GPUCount)
	}
	if f.GPUs.Model != "" {
		sc.Model = f.GPUs.Model
	}
	for k, n := range f.GPUs.MIGInstances {
		idx, err := strconv.Atoi(k)
		if err != nil || idx < 0 || idx >= sc.GPUCount {
			return nil, fmt.Errorf("gpus.migInstances: key %q must be a GPU index from 0 to %d", k, sc.GPUCount-1)
		}
		if n < 1 || n > MaxMIGInstances {
			return nil, fmt.Errorf("gpus.migInstances[%q]: must be between 1 and %d instances, got %d", k, MaxMIGInstances, n)
		}
		sc.MIGInstances[idx] = n
	}
	sc.Missing = map[int]bool{}
	for j, idx := range f.GPUs.Missing {
		switch {
		case idx < 0 || idx >= sc.GPUCount:
			return nil, fmt.Errorf("gpus.missing[%d]: must be a GPU index from 0 to %d, got %d", j, sc.GPUCount-1, idx)
		case sc.MIGInstances[idx] > 0:
			return nil, fmt.Errorf("gpus.missing[%d]: GPU %d has MIG instances; a GPU the driver does not answer for has none", j, idx)
		}
		sc.Missing[idx] = true
	}
	if len(sc.Missing) == sc.GPUCount {
		return nil, errors.New("gpus.missing: every GPU is missing; keep at least one the driver answers for")
	}
	if f.Duration != nil {
		if *f.Duration < 0 {
			return nil, errors.New("duration: must not be negative")
		}
		sc.Duration = time.Duration(*f.Duration)
	}
	eventNodes := strictyaml.Lookup(root, "events")
	if eventNodes != nil {
		// The decoder drops null items ("- ~", a bare "-") without a word, which would also
		// shift the lines reported for the events after them.
		for i, n := range eventNodes.Content {
			if n.Kind == yaml.AliasNode && n.Alias != nil {
				n = n.Alias
			}
			if n.ShortTag() == "!!null" {
				return nil, fmt.Errorf("events[%d] (line %d): the event is empty", i, n.Line)
			}
		}
	}
	for i, spec := range f.Events {
		line := 0
		if eventNodes != nil && i < len(eventNodes.Content) {
			line = eventNodes.Content[i].Line
		}
		ev, err := sc.event(spec, line)
		if err == nil && ev.Kind.DriverOnly() && !driver {
			err = fmt.Errorf("%s: only the simulated driver (gpuhealth sim-driver serve) answers it; the sim backend reads no NVML", ev.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("events[%d] (line %d): %w", i, line, err)
		}
		if spec.AfterReset != nil {
			sc.AfterReset = append(sc.AfterReset, ev)
			continue
		}
		sc.Events = append(sc.Events, ev)
	}
	slices.SortStableFunc(sc.Events, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	if sc.Duration > MaxDuration {
		return nil, fmt.Errorf("duration: %v is longer than the longest scenario, %v", sc.Duration, MaxDuration)
	}
	total := 0
	for _, ev := range sc.Events {
		if ev.At > MaxDuration {
			return nil, fmt.Errorf("events (line %d): at %v is past the longest scenario, %v", ev.Line, ev.At, MaxDuration)
		}
		total += ev.Repeat
	}
	// An afterReset event recurs at every reset: its storm counts against the limit once.
	for _, ev := range sc.AfterReset {
		if ev.At > MaxDuration {
			return nil, fmt.Errorf("events (line %d): afterReset %v is past the longest scenario, %v", ev.Line, ev.At, MaxDuration)
		}
		total += ev.Repeat
	}
	if total > MaxTotalRepeat {
		return nil, fmt.Errorf("events: %d signals in all (repeat included) is more than %d", total, MaxTotalRepeat)
	}
	if sc.Duration > 0 && len(sc.Events) > 0 && sc.Events[len(sc.Events)-1].At > sc.Duration {
		return nil, fmt.Errorf("duration: %v ends before the last event at %v", sc.Duration, sc.Events[len(sc.Events)-1].At)
	}
	return sc, nil
}

func (sc *Scenario) event(spec eventSpec, line int) (Event, error) {
	ev := Event{Line: line, GPU: -1, Repeat: 1}
	at, field := spec.At, "at"
	switch {
	case spec.At != nil && spec.AfterReset != nil:
		return ev, errors.New("at and afterReset: give one (afterReset repeats the event after every reset of its GPU)")
	case spec.AfterReset != nil:
		at, field = spec.AfterReset, "afterReset"
		if spec.Reset != nil || spec.Reboot != nil || spec.Driver != nil {
			return ev, errors.New("afterReset: only faults of a GPU can follow its reset")
		}
	case spec.At == nil:
		return ev, errors.New("at: required (a duration from the scenario start, such as 5s)")
	}
	if *at < 0 {
		return ev, errors.New(field + ": must not be negative")
	}
	ev.At = time.Duration(*at)
	if spec.Repeat != nil {
		if *spec.Repeat < 1 || *spec.Repeat > MaxRepeat {
			return ev, fmt.Errorf("repeat: must be between 1 and %d, got %d", MaxRepeat, *spec.Repeat)
		}
		ev.Repeat = *spec.Repeat
	}

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
		return ev, errors.New("no fault or repair given: set one of xid, ecc, remappedRows, retiredPages, temperatureC, clockEventReasons, pcieReplays, nvlink, recoveryAction, lost, reset, reboot, kmsg, fabric, rowRemapHistogram, sramThresholdExceeded, pcieLink, nvlinkRecoveries, peerFault, latent, diag (and, for the simulated driver, driver, hang, outOfRange, readsLower, migInstances)")
	case 1:
		ev.Kind = kinds[0]
	default:
		return ev, fmt.Errorf("%s and %s in one event: give each its own event", kinds[0], kinds[1])
	}

	if ev.Kind == EventKmsg {
		return sc.kmsgEvent(spec, ev)
	}
	if ev.Kind == EventPeerFault {
		return sc.peerFaultEvent(spec, ev)
	}
	if ev.Kind == EventDriver {
		if *spec.Driver != DriverUnload && *spec.Driver != DriverLoad {
			return ev, fmt.Errorf("driver: must be %s or %s, got %q", DriverUnload, DriverLoad, *spec.Driver)
		}
		if spec.GPU != nil {
			return ev, errors.New("gpu: the driver serves the whole node; remove gpu")
		}
		if spec.Repeat != nil {
			return ev, errors.New("repeat: a driver is unloaded or loaded once")
		}
		ev.DriverAction = *spec.Driver
		return ev, nil
	}
	if ev.Kind == EventReboot {
		if !*spec.Reboot {
			return ev, errors.New("reboot: only 'reboot: true' is meaningful")
		}
		if spec.GPU != nil {
			return ev, errors.New("gpu: a reboot concerns the whole node; remove gpu")
		}
		return ev, nil
	}
	if spec.GPU == nil {
		return ev, errors.New("gpu: required (an index or a UUID)")
	}
	if err := sc.resolveGPU(*spec.GPU, &ev); err != nil {
		return ev, err
	}
	if ev.MIG > 0 && ev.Kind != EventXID {
		return ev, fmt.Errorf("gpu: %s events concern the physical GPU; name GPU %d instead of a MIG instance", ev.Kind, ev.GPU)
	}
	if (spec.XIDSeverity != nil || spec.CausedByPrevious != nil) && ev.Kind != EventXID {
		return ev, errors.New("xidSeverity/causedByPrevious: only qualify an xid")
	}
	if (spec.GPUInstance != nil || spec.ComputeInstance != nil) && ev.Kind != EventXID {
		return ev, errors.New("gpuInstance/computeInstance: only XIDs can be scoped to a MIG instance")
	}
	if spec.ComputeInstance != nil && spec.GPUInstance == nil {
		return ev, errors.New("computeInstance: needs gpuInstance")
	}

	switch ev.Kind {
	case EventXID:
		if *spec.XID == 0 {
			return ev, errors.New("xid: must be a positive XID number")
		}
		ev.XID = *spec.XID
		if ev.MIG > 0 && spec.GPUInstance != nil {
			return ev, errors.New("gpuInstance: the gpu is already a MIG instance")
		}
		ev.GPUInstance, ev.ComputeInstance = spec.GPUInstance, spec.ComputeInstance
		if spec.XIDSeverity != nil {
			switch *spec.XIDSeverity {
			case "Fatal":
				ev.XIDFlags |= health.XIDFatal
			case "Nonfatal":
				ev.XIDFlags |= health.XIDNonfatal
			default:
				return ev, fmt.Errorf("xidSeverity: want Fatal or Nonfatal (as the driver logs NVLink5 XIDs), got %q", *spec.XIDSeverity)
			}
		}
		if spec.CausedByPrevious != nil && *spec.CausedByPrevious {
			ev.XIDFlags |= health.XIDCausedByPrevious
		}
	case EventECC:
		if spec.ECC.CorrectedVolatile == nil && spec.ECC.UncorrectedVolatile == nil {
			return ev, errors.New("ecc: set correctedVolatile or uncorrectedVolatile (a counter increase)")
		}
		if spec.ECC.CorrectedVolatile != nil {
			ev.CorrectedIncrease = *spec.ECC.CorrectedVolatile
		}
		if spec.ECC.UncorrectedVolatile != nil {
			ev.UncorrectedIncrease = *spec.ECC.UncorrectedVolatile
		}
	case EventRemappedRows:
		if spec.RemappedRows.Pending == nil && spec.RemappedRows.Failure == nil {
			return ev, errors.New("remappedRows: set pending or failure")
		}
		ev.RowsPending, ev.RowsFailure = spec.RemappedRows.Pending, spec.RemappedRows.Failure
	case EventRetiredPages:
		if spec.RetiredPages.Pending == nil {
			return ev, errors.New("retiredPages: set pending")
		}
		ev.PagesPending = *spec.RetiredPages.Pending
	case EventTemperature:
		if *spec.TemperatureC < -50 || *spec.TemperatureC > 200 {
			return ev, fmt.Errorf("temperatureC: %d is not a plausible GPU temperature (-50 to 200)", *spec.TemperatureC)
		}
		ev.TemperatureC = *spec.TemperatureC
	case EventClockEventReasons:
		for i, name := range *spec.ClockEventReasons {
			r, err := health.ParseClockEventReason(name)
			if err != nil {
				return ev, fmt.Errorf("clockEventReasons[%d]: %w", i, err)
			}
			ev.ClockEventReasons |= r
		}
	case EventPCIeReplays:
		if *spec.PCIeReplays < 0 {
			return ev, errors.New("pcieReplays: a counter increase must not be negative")
		}
		ev.PCIeReplaysIncrease = *spec.PCIeReplays
	case EventNVLink:
		l := spec.NVLink
		if l.Link == nil {
			return ev, errors.New("nvlink.link: required")
		}
		if *l.Link >= MaxNVLinks {
			return ev, fmt.Errorf("nvlink.link: must be below %d, got %d", MaxNVLinks, *l.Link)
		}
		if (l.Down == nil) == (l.CRCErrors == nil) {
			return ev, errors.New("nvlink: set exactly one of down or crcErrors")
		}
		if l.CRCErrors != nil && *l.CRCErrors < 0 {
			return ev, errors.New("nvlink.crcErrors: a counter increase must not be negative")
		}
		ev.Link, ev.LinkDown = *l.Link, l.Down
		if l.CRCErrors != nil {
			ev.LinkErrorsIncrease = *l.CRCErrors
		}
	case EventRecoveryAction:
		a, err := health.ParseRecoveryAction(*spec.RecoveryAction)
		if err != nil {
			return ev, fmt.Errorf("recoveryAction: %w", err)
		}
		ev.RecoveryAction = a
	case EventLost:
		if !*spec.Lost {
			return ev, errors.New("lost: only 'lost: true' is meaningful; a lost GPU comes back with a reboot")
		}
	case EventReset:
		if !*spec.Reset {
			return ev, errors.New("reset: only 'reset: true' is meaningful")
		}
	case EventHang:
		if *spec.Hang <= 0 || time.Duration(*spec.Hang) > MaxHang {
			return ev, fmt.Errorf("hang: must be more than 0 and at most %v, got %v", MaxHang, time.Duration(*spec.Hang))
		}
		ev.Hang = time.Duration(*spec.Hang)
	case EventOutOfRange:
		if !slices.Contains(OutOfRangeReadings, *spec.OutOfRange) {
			return ev, fmt.Errorf("outOfRange: must be one of %s, got %q", strings.Join(OutOfRangeReadings, ", "), *spec.OutOfRange)
		}
		ev.Reading = *spec.OutOfRange
	case EventReadsLower:
		if !slices.Contains(ReadsLowerReadings, *spec.ReadsLower) {
			return ev, fmt.Errorf("readsLower: must be one of %s, got %q", strings.Join(ReadsLowerReadings, ", "), *spec.ReadsLower)
		}
		ev.Reading = *spec.ReadsLower
	case EventFabric, EventRowRemapHistogram, EventSRAM, EventPCIeLink, EventNVLinkRecoveries:
		return ev, earlyWarningEvent(spec, &ev)
	case EventLatent, EventDiag:
		return ev, diagEvent(spec, &ev)
	case EventMIG:
		if *spec.MIGInstances < 0 || *spec.MIGInstances > MaxMIGInstances {
			return ev, fmt.Errorf("migInstances: must be between 0 (MIG off) and %d, got %d", MaxMIGInstances, *spec.MIGInstances)
		}
		ev.MIGCount = *spec.MIGInstances
	}
	return ev, nil
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
			PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x10+i),
			Minor:    i,
			Model:    sc.Model,
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
		out[i] = fmt.Sprintf("0000:%02x:00.0", 0x10+i)
	}
	return out
}

// Placeholders returns the placeholder devices of the GPUs in gpus.missing
// (health.MissingGPUs).
func (sc *Scenario) Placeholders() []health.Device {
	return health.MissingGPUs(sc.Devices(), sc.OnBus(), 0)
}
