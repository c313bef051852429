package sim

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/gpuhealth/gpuhealth/pkg/strictyaml"
)

// Reading a scenario file: the file's YAML form, and its parsing step by step (the header, the
// GPUs, the events, the limits). One event is parsed in parse_event.go.

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
	Serials      []string       `yaml:"serials"`
	VBIOS        *string        `yaml:"vbios"`
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
func LoadScenario(path string) (*Scenario, error) { return loadScenario(path, false) }

// LoadDriverScenario is LoadScenario for the simulated driver: it also takes the events only a
// driver can answer (EventKind.DriverOnly).
func LoadDriverScenario(path string) (*Scenario, error) { return loadScenario(path, true) }

// loadScenario reads the file at path and parses it as parseScenario does; errors name the file.
func loadScenario(path string, driver bool) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sc, err := parseScenario(data, driver)
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
	if err := sc.parseGPUs(f.GPUs); err != nil {
		return nil, err
	}
	if f.Duration != nil {
		if *f.Duration < 0 {
			return nil, errors.New("duration: must not be negative")
		}
		sc.Duration = time.Duration(*f.Duration)
	}
	if err := sc.parseEvents(f.Events, strictyaml.Lookup(root, "events"), driver); err != nil {
		return nil, err
	}
	if err := sc.checkLimits(); err != nil {
		return nil, err
	}
	return sc, nil
}

// parseGPUs reads the gpus section: how many, which model, their MIG instances, the missing, the
// serials and the VBIOS version.
func (sc *Scenario) parseGPUs(g *gpusSpec) error {
	if g == nil || g.Count == nil {
		return errors.New("gpus.count: required")
	}
	sc.GPUCount = *g.Count
	if sc.GPUCount < 1 || sc.GPUCount > MaxGPUs {
		return fmt.Errorf("gpus.count: must be between 1 and %d, got %d", MaxGPUs, sc.GPUCount)
	}
	if g.Model != "" {
		sc.Model = g.Model
	}
	for k, n := range g.MIGInstances {
		idx, err := strconv.Atoi(k)
		if err != nil || idx < 0 || idx >= sc.GPUCount {
			return fmt.Errorf("gpus.migInstances: key %q must be a GPU index from 0 to %d", k, sc.GPUCount-1)
		}
		if n < 1 || n > MaxMIGInstances {
			return fmt.Errorf("gpus.migInstances[%q]: must be between 1 and %d instances, got %d", k, MaxMIGInstances, n)
		}
		sc.MIGInstances[idx] = n
	}
	if err := sc.parseMissing(g.Missing); err != nil {
		return err
	}
	if err := sc.parseSerials(g.Serials); err != nil {
		return err
	}
	return sc.parseVBIOS(g.VBIOS)
}

// parseMissing reads gpus.missing, once the GPUs' count and MIG instances are known.
func (sc *Scenario) parseMissing(missing []int) error {
	sc.Missing = map[int]bool{}
	for j, idx := range missing {
		switch {
		case idx < 0 || idx >= sc.GPUCount:
			return fmt.Errorf("gpus.missing[%d]: must be a GPU index from 0 to %d, got %d", j, sc.GPUCount-1, idx)
		case sc.MIGInstances[idx] > 0:
			return fmt.Errorf("gpus.missing[%d]: GPU %d has MIG instances; a GPU the driver does not answer for has none", j, idx)
		}
		sc.Missing[idx] = true
	}
	if len(sc.Missing) == sc.GPUCount {
		return errors.New("gpus.missing: every GPU is missing; keep at least one the driver answers for")
	}
	return nil
}

// parseEvents parses the events (nodes are their YAML nodes, for their lines) into Events and
// AfterReset, and sorts Events by time. Events only a driver can answer are refused unless
// driver is set.
func (sc *Scenario) parseEvents(specs []eventSpec, nodes *yaml.Node, driver bool) error {
	if nodes != nil {
		// The decoder drops null items ("- ~", a bare "-") without a word, which would also
		// shift the lines reported for the events after them.
		for i, n := range nodes.Content {
			if n.Kind == yaml.AliasNode && n.Alias != nil {
				n = n.Alias
			}
			if n.ShortTag() == "!!null" {
				return fmt.Errorf("events[%d] (line %d): the event is empty", i, n.Line)
			}
		}
	}
	for i, spec := range specs {
		line := 0
		if nodes != nil && i < len(nodes.Content) {
			line = nodes.Content[i].Line
		}
		ev, err := sc.event(spec, line)
		if err == nil && ev.Kind.DriverOnly() && !driver {
			err = fmt.Errorf("%s: only the simulated driver (gpuhealth sim-driver serve) answers it; the sim backend reads no NVML", ev.Kind)
		}
		if err != nil {
			return fmt.Errorf("events[%d] (line %d): %w", i, line, err)
		}
		if spec.AfterReset != nil {
			sc.AfterReset = append(sc.AfterReset, ev)
			continue
		}
		sc.Events = append(sc.Events, ev)
	}
	slices.SortStableFunc(sc.Events, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return nil
}

// checkLimits bounds the parsed scenario: its length on virtual time and the signals all its
// events produce.
func (sc *Scenario) checkLimits() error {
	if sc.Duration > MaxDuration {
		return fmt.Errorf("duration: %v is longer than the longest scenario, %v", sc.Duration, MaxDuration)
	}
	total := 0
	for _, ev := range sc.Events {
		if ev.At > MaxDuration {
			return fmt.Errorf("events (line %d): at %v is past the longest scenario, %v", ev.Line, ev.At, MaxDuration)
		}
		total += ev.Repeat
	}
	// An afterReset event recurs at every reset: its storm counts against the limit once.
	for _, ev := range sc.AfterReset {
		if ev.At > MaxDuration {
			return fmt.Errorf("events (line %d): afterReset %v is past the longest scenario, %v", ev.Line, ev.At, MaxDuration)
		}
		total += ev.Repeat
	}
	if total > MaxTotalRepeat {
		return fmt.Errorf("events: %d signals in all (repeat included) is more than %d", total, MaxTotalRepeat)
	}
	if sc.Duration > 0 && len(sc.Events) > 0 && sc.Events[len(sc.Events)-1].At > sc.Duration {
		return fmt.Errorf("duration: %v ends before the last event at %v", sc.Duration, sc.Events[len(sc.Events)-1].At)
	}
	return nil
}
