package config

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/dra/nvidia"
)

// Reporter names accepted in agent.reporters.
const (
	ReporterAnnotation  = "annotation"
	ReporterDeviceTaint = "devicetaint"
	ReporterCondition   = "condition"
	ReporterClaimStatus = "claimstatus"
	// ReporterHAMi writes HAMi's per-GPU cordon (hami.io/device-cordon); opt-in.
	ReporterHAMi = "hami"
	// ReporterNVSentinel sends GPU faults to NVSentinel's platform-connector (agent.nvsentinel);
	// opt-in.
	ReporterNVSentinel = "nvsentinel"
)

// AllReporters lists the reporters the agent runs by default, in the order it starts them.
func AllReporters() []string {
	return []string{ReporterAnnotation, ReporterDeviceTaint, ReporterCondition, ReporterClaimStatus}
}

// KnownReporters lists every reporter agent.reporters may name: the defaults and the opt-in ones.
func KnownReporters() []string { return append(AllReporters(), ReporterHAMi, ReporterNVSentinel) }

// Defaults of the agent section. The DRA names are what NVIDIA's DRA driver publishes, owned by
// package nvidia (pkg/dra/nvidia) and named here as the section's defaults.
const (
	DefaultDriverName    = nvidia.DriverName
	DefaultUUIDAttribute = nvidia.UUIDAttribute
	// DefaultParentUUIDAttribute holds, on MIG devices and DynamicMIG partitions, their GPU's UUID.
	DefaultParentUUIDAttribute = nvidia.ParentUUIDAttribute
	// DefaultPCIBusIDAttribute holds a device's PCI address (the standard attribute NVIDIA's
	// driver sets on GPUs, MIG devices and VFIO passthrough devices).
	DefaultPCIBusIDAttribute = nvidia.PCIBusIDAttribute
	DefaultCheckpointPath    = "/var/lib/gpuhealth/checkpoint.json"
	DefaultResync            = 5 * time.Minute
	DefaultHeartbeat         = 5 * time.Minute
	// DefaultNVLinkDomainLabel is GPU feature discovery's label of a node's NVLink clique.
	DefaultNVLinkDomainLabel = "nvidia.com/gpu.clique"
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
	// Heartbeat is how often the agent confirms its report even when nothing changed (default
	// 5m, at least 10s): it renews its heartbeat Lease (gpuhealth-heartbeat-<node> in its
	// namespace), with no Node write. Readers take a report whose heartbeat is a few periods old
	// for a stopped agent's.
	Heartbeat *Duration `yaml:"heartbeat,omitempty" json:"heartbeat,omitempty"`
	// CircuitBreaker stops disruptive taint effects in a mass failure.
	CircuitBreaker CircuitBreakerConfig `yaml:"circuitBreaker,omitempty" json:"circuitBreaker,omitempty"`
	// Eviction evicts the pods holding a GPU whose condition asks for eviction (opt-in).
	Eviction EvictionConfig `yaml:"eviction,omitempty" json:"eviction,omitempty"`
	// ClaimStatus says how the claimstatus reporter finds the ResourceClaims of this node's pods.
	ClaimStatus ClaimStatusConfig `yaml:"claimStatus,omitempty" json:"claimStatus,omitempty"`
	// NVLinkDomainLabel is the Node label that names the node's NVLink domain (default
	// nvidia.com/gpu.clique, which NVIDIA's GPU feature discovery sets to the fabric's
	// <clusterUUID>.<cliqueID>; "-" turns it off). The agent of a node with the label reads the
	// reports of the other nodes with the same value while an XID its driver says an earlier one
	// caused waits for its root, and attributes it to a fault one of them reports (docs/agent.md,
	// "NVLink domains").
	NVLinkDomainLabel string `yaml:"nvlinkDomainLabel,omitempty" json:"nvlinkDomainLabel,omitempty"`
	// RepairCondition is the Node condition node repair engines act on (docs/repair-engines.md).
	RepairCondition RepairConditionConfig `yaml:"repairCondition,omitempty" json:"repairCondition,omitempty"`
	// NVSentinel configures the nvsentinel reporter (docs/nvsentinel.md).
	NVSentinel NVSentinelConfig `yaml:"nvsentinel,omitempty" json:"nvsentinel,omitempty"`
	// DeviceAPI serves NVIDIA's Device API on a node-local socket (docs/device-api.md); off by
	// default.
	DeviceAPI DeviceAPIConfig `yaml:"deviceAPI,omitempty" json:"deviceAPI,omitempty"`
}

// EvictionConfig: when a GPU gets a condition that asks for eviction (XID 79, a lost GPU, ...),
// the agent evicts the pods that hold it or one of its MIG instances through the Eviction API
// (PodDisruptionBudgets honoured): device-plugin pods found through the kubelet's pod-resources
// API and Volcano GPU-sharing pods by their card annotation. DRA pods are left to the
// device-taint controller (noExecute). Every GPU whose pods are evicted takes a circuit-breaker
// slot when the breaker is on (docs/agent.md).
type EvictionConfig struct {
	Enabled bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// DryRun records what would be evicted (Events, the gpuhealth.dev/gpu-evictions annotation
	// that `gpuhealth status` shows) and evicts nothing.
	DryRun bool `yaml:"dryRun,omitempty" json:"dryRun,omitempty"`
	// GracePeriod is how long a GPU must keep asking for eviction before its pods are evicted
	// (default 0: at once). A condition that clears within it evicts nothing.
	GracePeriod *Duration `yaml:"gracePeriod,omitempty" json:"gracePeriod,omitempty"`
	// ExcludeNamespaces are never evicted from, nor reported.
	ExcludeNamespaces []string `yaml:"excludeNamespaces,omitempty" json:"excludeNamespaces,omitempty"`
	// ReportOnlyNamespaces get an Event on the pod saying it holds a GPU that asks for
	// eviction, and no eviction.
	ReportOnlyNamespaces []string `yaml:"reportOnlyNamespaces,omitempty" json:"reportOnlyNamespaces,omitempty"`
	// DaemonSetPods lets DaemonSet pods be evicted too (default false: their controller would
	// put them back on the same node at once). The agent's own pod is never evicted.
	DaemonSetPods bool `yaml:"daemonSetPods,omitempty" json:"daemonSetPods,omitempty"`
	// PodResourcesSocket is the kubelet's pod-resources socket (default
	// /var/lib/kubelet/pod-resources/kubelet.sock).
	PodResourcesSocket string `yaml:"podResourcesSocket,omitempty" json:"podResourcesSocket,omitempty"`
	// Retry is how often a GPU's pods are looked at again while it asks for eviction (a PDB
	// that blocks, an unreachable kubelet; default 10s, at least 1s).
	Retry *Duration `yaml:"retry,omitempty" json:"retry,omitempty"`
}

// ClaimStatusConfig: the claimstatus reporter finds the claims of the pods on its node through
// the kubelet's pod-resources API, which names each container's DRA claims (kubelet 1.34 and
// later by default), and reads only those. PodWatch finds them through a watch of the node's
// pods instead, for kubelets that do not report claims: it needs cluster-wide pods list/watch,
// which the chart grants only with this on.
type ClaimStatusConfig struct {
	// PodResourcesSocket is the kubelet's pod-resources socket (default
	// /var/lib/kubelet/pod-resources/kubelet.sock).
	PodResourcesSocket string `yaml:"podResourcesSocket,omitempty" json:"podResourcesSocket,omitempty"`
	// PodWatch finds the claims through a watch of the pods bound to the node (selected by
	// spec.nodeName) instead of the kubelet (default false).
	PodWatch bool `yaml:"podWatch,omitempty" json:"podWatch,omitempty"`
}

// WithDefaults returns a copy with defaults filled in.
func (c ClaimStatusConfig) WithDefaults() ClaimStatusConfig {
	c.PodResourcesSocket = cmp.Or(c.PodResourcesSocket, DefaultPodResourcesSocket)
	return c
}

// Eviction defaults.
const (
	DefaultEvictionRetry = 10 * time.Second
)

// WithDefaults returns a copy with defaults filled in.
func (e EvictionConfig) WithDefaults() EvictionConfig {
	if e.GracePeriod == nil {
		d := Duration(0)
		e.GracePeriod = &d
	}
	if e.PodResourcesSocket == "" {
		e.PodResourcesSocket = DefaultPodResourcesSocket
	}
	if e.Retry == nil {
		d := Duration(DefaultEvictionRetry)
		e.Retry = &d
	}
	return e
}

func (e EvictionConfig) validate(bad func(path, format string, args ...any)) {
	if g := e.GracePeriod; g != nil && time.Duration(*g) < 0 {
		bad("agent.eviction.gracePeriod", "must not be negative, got %v", time.Duration(*g))
	}
	if r := e.Retry; r != nil && time.Duration(*r) < time.Second {
		bad("agent.eviction.retry", "must be at least 1s, got %v", time.Duration(*r))
	}
	for i, ns := range e.ExcludeNamespaces {
		if slices.Contains(e.ReportOnlyNamespaces, ns) {
			bad(fmt.Sprintf("agent.eviction.excludeNamespaces[%d]", i), "namespace %q is also in reportOnlyNamespaces", ns)
		}
	}
	for i, ns := range slices.Concat(e.ExcludeNamespaces, e.ReportOnlyNamespaces) {
		if ns == "" {
			bad(fmt.Sprintf("agent.eviction namespaces[%d]", i), "empty namespace name")
		}
	}
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
	// Domains add a budget per value of a node label (breakerdomains.go).
	Domains []BreakerDomain `yaml:"domains,omitempty" json:"domains,omitempty"`
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
	if a.NVLinkDomainLabel == "" {
		a.NVLinkDomainLabel = DefaultNVLinkDomainLabel
	}
	a.ClaimStatus = a.ClaimStatus.WithDefaults()
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
	a.NVSentinel = a.NVSentinel.WithDefaults()
	a.DeviceAPI = a.DeviceAPI.WithDefaults()
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
	a.CircuitBreaker.validateDomains(bad)
	if l := a.NVLinkDomainLabel; l != "" && l != "-" {
		if err := validLabelKey(l); err != nil {
			bad("agent.nvlinkDomainLabel", "%q is not a label key: %v", l, err)
		}
	}
	a.Eviction.validate(bad)
	a.NVSentinel.validate(bad)
	a.DeviceAPI.validate(bad)
}

// Label keys as Kubernetes takes them (apimachinery's IsQualifiedName, which pkg/health may not
// import): an optional DNS-subdomain prefix and a slash, then a name of at most 63 characters.
var (
	labelName   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelPrefix = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func validLabelKey(key string) error {
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	switch {
	case hasPrefix && (prefix == "" || len(prefix) > 253 || !labelPrefix.MatchString(prefix)):
		return errors.New("the prefix must be a DNS subdomain (lowercase alphanumerics, '-' and '.', at most 253 characters)")
	case name == "" || len(name) > 63 || !labelName.MatchString(name):
		return errors.New("the name must be 1 to 63 alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric")
	}
	return nil
}
