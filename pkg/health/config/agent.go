package config

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"time"
)

// Reporter names accepted in agent.reporters.
const (
	ReporterAnnotation  = "annotation"
	ReporterDeviceTaint = "devicetaint"
	ReporterCondition   = "condition"
	ReporterClaimStatus = "claimstatus"
	// ReporterHAMi writes HAMi's per-GPU cordon (hami.io/device-cordon); opt-in.
	ReporterHAMi = "hami"
)

// AllReporters lists the reporters the agent runs by default, in the order it starts them.
func AllReporters() []string {
	return []string{ReporterAnnotation, ReporterDeviceTaint, ReporterCondition, ReporterClaimStatus}
}

// KnownReporters lists every reporter agent.reporters may name: the defaults and the opt-in ones.
func KnownReporters() []string { return append(AllReporters(), ReporterHAMi) }

// Defaults of the agent section.
const (
	DefaultDriverName    = "gpu.nvidia.com"
	DefaultUUIDAttribute = "uuid"
	// DefaultParentUUIDAttribute holds, on MIG devices and DynamicMIG partitions, their GPU's UUID.
	DefaultParentUUIDAttribute = "parentUUID"
	// DefaultPCIBusIDAttribute holds a device's PCI address (the standard attribute NVIDIA's
	// driver sets on GPUs, MIG devices and VFIO passthrough devices).
	DefaultPCIBusIDAttribute = "resource.kubernetes.io/pciBusID"
	DefaultCheckpointPath    = "/var/lib/gpuhealth/checkpoint.json"
	DefaultResync            = 5 * time.Minute
	DefaultHeartbeat         = 5 * time.Minute
	MinHeartbeat             = 10 * time.Second
)

// AgentConfig is the `agent` section: how `gpuhealth agent` reports. It is plain data so that
// this package stays free of Kubernetes imports.
type AgentConfig struct {
	// Reporters to run (default: annotation, devicetaint, condition, claimstatus; hami is
	// opt-in). Metrics always run.
	Reporters []string `yaml:"reporters,omitempty" json:"reporters,omitempty"`
	// DriverName is the DRA driver whose ResourceSlices carry the GPUs (default gpu.nvidia.com).
	DriverName string `yaml:"driverName,omitempty" json:"driverName,omitempty"`
	// UUIDAttribute is the DRA device attribute holding the GPU UUID (default uuid).
	UUIDAttribute string `yaml:"uuidAttribute,omitempty" json:"uuidAttribute,omitempty"`
	// ParentUUIDAttribute is the attribute of MIG devices and DynamicMIG partitions holding their
	// GPU's UUID (default parentUUID): a GPU's fault taints them all.
	ParentUUIDAttribute string `yaml:"parentUUIDAttribute,omitempty" json:"parentUUIDAttribute,omitempty"`
	// PCIBusIDAttribute is the attribute holding a device's PCI address (default
	// resource.kubernetes.io/pciBusID): a GPU's fault taints its VFIO passthrough device by it.
	PCIBusIDAttribute string `yaml:"pciBusIDAttribute,omitempty" json:"pciBusIDAttribute,omitempty"`
	// NoExecute lets conditions that ask for eviction taint DRA devices NoExecute (default
	// false: evicting running work is opt-in).
	NoExecute bool `yaml:"noExecute,omitempty" json:"noExecute,omitempty"`
	// CheckpointPath is where sticky faults are kept across restarts; "-" turns it off.
	CheckpointPath string `yaml:"checkpointPath,omitempty" json:"checkpointPath,omitempty"`
	// Resync is how often every reporter re-checks the API server without a change (default 5m).
	Resync *Duration `yaml:"resync,omitempty" json:"resync,omitempty"`
	// Heartbeat is how often the agent confirms its report on the Node even when nothing
	// changed (default 5m, at least 10s): the gpuhealth.dev/gpu-health-heartbeat annotation and
	// the GPUUnhealthy condition's lastHeartbeatTime, in one write. Readers take a report whose
	// heartbeat is a few periods old for a stopped agent's.
	Heartbeat *Duration `yaml:"heartbeat,omitempty" json:"heartbeat,omitempty"`
	// CircuitBreaker stops disruptive taint effects in a mass failure.
	CircuitBreaker CircuitBreakerConfig `yaml:"circuitBreaker,omitempty" json:"circuitBreaker,omitempty"`
}

// CircuitBreakerConfig: when more than MaxFraction of the cluster's GPUs would turn NoSchedule or
// NoExecute within Window, further GPUs are tainted None instead, until an operator acknowledges
// (`gpuhealth breaker ack`) or the wave leaves the window. The budget is a set of Lease slots in
// Namespace (gpuhealth-breaker-slot-<k>, one per GPU admitted, so racing agents never contend on
// one object); the cluster's GPU count and the acknowledgement live in the ConfigMap
// gpuhealth-circuit-breaker there, written by one leader-elected `gpuhealth breaker controller`.
type CircuitBreakerConfig struct {
	Enabled     bool      `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	MaxFraction float64   `yaml:"maxFraction,omitempty" json:"maxFraction,omitempty"`
	Window      *Duration `yaml:"window,omitempty" json:"window,omitempty"`
	// Namespace of the slot Leases and the count ConfigMap (default: $POD_NAMESPACE, else
	// gpuhealth-system).
	Namespace string `yaml:"namespace,omitempty" json:"namespace,omitempty"`
}

// Circuit breaker defaults.
const (
	DefaultBreakerFraction  = 0.1
	DefaultBreakerWindow    = 10 * time.Minute
	DefaultBreakerNamespace = "gpuhealth-system"
)

// WithDefaults returns a copy with defaults filled in.
func (a AgentConfig) WithDefaults() AgentConfig {
	if a.Reporters == nil {
		a.Reporters = AllReporters()
	}
	if a.DriverName == "" {
		a.DriverName = DefaultDriverName
	}
	if a.UUIDAttribute == "" {
		a.UUIDAttribute = DefaultUUIDAttribute
	}
	if a.ParentUUIDAttribute == "" {
		a.ParentUUIDAttribute = DefaultParentUUIDAttribute
	}
	if a.PCIBusIDAttribute == "" {
		a.PCIBusIDAttribute = DefaultPCIBusIDAttribute
	}
	if a.CheckpointPath == "" {
		a.CheckpointPath = DefaultCheckpointPath
	}
	if a.Resync == nil {
		d := Duration(DefaultResync)
		a.Resync = &d
	}
	if a.Heartbeat == nil {
		d := Duration(DefaultHeartbeat)
		a.Heartbeat = &d
	}
	if a.CircuitBreaker.MaxFraction == 0 {
		a.CircuitBreaker.MaxFraction = DefaultBreakerFraction
	}
	if a.CircuitBreaker.Window == nil {
		d := Duration(DefaultBreakerWindow)
		a.CircuitBreaker.Window = &d
	}
	if a.CircuitBreaker.Namespace == "" {
		a.CircuitBreaker.Namespace = cmp.Or(os.Getenv("POD_NAMESPACE"), DefaultBreakerNamespace)
	}
	return a
}

func (a AgentConfig) validate(bad func(path, format string, args ...any)) {
	for i, r := range a.Reporters {
		if !slices.Contains(KnownReporters(), r) {
			bad(fmt.Sprintf("agent.reporters[%d]", i), "unknown reporter %q (want one of %v)", r, KnownReporters())
		}
	}
	attrs := a.WithDefaults()
	if attrs.UUIDAttribute == attrs.ParentUUIDAttribute || attrs.UUIDAttribute == attrs.PCIBusIDAttribute || attrs.ParentUUIDAttribute == attrs.PCIBusIDAttribute {
		bad("agent", "uuidAttribute (%q), parentUUIDAttribute (%q) and pciBusIDAttribute (%q) must differ",
			attrs.UUIDAttribute, attrs.ParentUUIDAttribute, attrs.PCIBusIDAttribute)
	}
	if a.Resync != nil && time.Duration(*a.Resync) < time.Second {
		bad("agent.resync", "must be at least 1s, got %v", time.Duration(*a.Resync))
	}
	if a.Heartbeat != nil && time.Duration(*a.Heartbeat) < MinHeartbeat {
		bad("agent.heartbeat", "must be at least %v, got %v", MinHeartbeat, time.Duration(*a.Heartbeat))
	}
	if f := a.CircuitBreaker.MaxFraction; f < 0 || f > 1 || f != f {
		bad("agent.circuitBreaker.maxFraction", "must be between 0 and 1, got %v", f)
	}
	if w := a.CircuitBreaker.Window; w != nil && time.Duration(*w) <= 0 {
		bad("agent.circuitBreaker.window", "must be positive, got %v", time.Duration(*w))
	}
}
