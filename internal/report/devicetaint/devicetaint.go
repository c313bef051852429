// Package devicetaint reports GPU health to DRA schedulers: for every GPU (or MIG instance) that
// is not Healthy it keeps one cluster-scoped resource.k8s.io/v1 DeviceTaintRule per DRA device
// that the GPU backs, and deletes the rules when the GPU recovers.
//
// The devices are found in this node's ResourceSlices of the configured driver (default
// gpu.nvidia.com) by three attributes, the NVIDIA DRA driver's names by default (see
// docs/dra-devices.md and package dradevices):
//
//   - uuid: the GPU's own device, whatever its name, and a static MIG device by its MIG UUID;
//   - parentUUID: every MIG device and dynamic MIG partition of a GPU, when the whole GPU is sick;
//   - resource.kubernetes.io/pciBusID: every device at the GPU's PCI address, such as the VFIO
//     passthrough device, when the whole GPU is sick.
//
// A fault of one MIG instance taints only the DRA device that carries its MIG UUID. The taint:
//
//   - key gpuhealth.dev/<worst condition> (xid, gpu-lost, thermal, ecc-uncorrected, ...);
//   - value the XID for XID conditions, else the condition's reason;
//   - effect None for Degraded, NoSchedule for Unhealthy, NoExecute for conditions asking for
//     eviction when the agent is configured to evict (off by default);
//   - timeAdded set by the API server when the rule is created or its effect changes.
//
// Rules are named after the node and the GPU (gpuhealth-<node>-<uuid>, see RuleName), labelled
// with both and owned by the Node, so they go away with it. A name another node's rule holds is
// not fought over: the rule is created under a generated name and Options.NameTaken says so. A
// GPU with no matching DRA device is reported through Options.Unmatched, never an error.
//
// The syncer does not watch rules, because at fleet scale that costs the API server one
// dispatch per agent for every rule event in the cluster; it keeps its own view, listed at start
// and every Options.Relist and updated with each write's response, so a rule deleted or edited by
// hand is repaired at the next relist (the agent's resync period).
package devicetaint

import (
	"context"
	"errors"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/dra/nvidia"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Labels on every rule.
const (
	NodeLabel      = "gpuhealth.dev/node"
	UUIDLabel      = "gpuhealth.dev/gpu-uuid"
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "gpuhealth"
	TaintKeyPrefix = dra.TaintKeyPrefix
)

// Options configure a Syncer.
type Options struct {
	// Driver is the DRA driver whose ResourceSlices describe the GPUs (default gpu.nvidia.com).
	Driver string
	// UUIDAttribute is the device attribute holding the UUID of the GPU or MIG device (default
	// "uuid"). Like ParentUUIDAttribute, it matches both the bare name and the driver-qualified one.
	UUIDAttribute string
	// ParentUUIDAttribute is the attribute of MIG devices and partitions holding their GPU's UUID
	// (default "parentUUID").
	ParentUUIDAttribute string
	// PCIBusIDAttribute is the attribute holding the PCI address of the GPU a device belongs to
	// (default "resource.kubernetes.io/pciBusID"); VFIO passthrough devices are found by it.
	PCIBusIDAttribute string
	// Devices, when set, is the agent's shared index of this node's DRA devices (of Driver and
	// the same attributes); nil gives the syncer one of its own.
	Devices *dradevices.Index
	// NoExecute lets conditions that ask for eviction use the NoExecute effect. Off by default:
	// evicting running work is a decision an operator opts into.
	NoExecute bool
	// Unmatched is called, once per device and state, for a device that is not Healthy but has
	// no DRA device to taint.
	Unmatched func(d health.DeviceStatus)
	// NameTaken is called, once per rule, when a rule of another node (or of none) holds a rule's
	// name, so that the rule has to be created under another (see RuleName).
	NameTaken func(name, holderNode string)
	// Breaker, when set, must admit every escalation to NoSchedule or NoExecute; HeldChanged is
	// called with this node's held-back GPUs whenever that set changes.
	Breaker     Breaker
	HeldChanged func(held []string)
	// Relist is how often the syncer lists its rules from the API server to catch changes made
	// by someone else (default 5m; the agent uses its resync period).
	Relist time.Duration
	// Clock times the relists (default the real clock).
	Clock clock.PassiveClock
}

// Breaker is the circuit breaker the syncer asks (see internal/breaker).
type Breaker interface {
	Admit(ctx context.Context, uuid string) (bool, error)
	SetHeld(uuids []string) bool
}

// Syncer keeps the DeviceTaintRules of one node.
type Syncer struct {
	client   kube.Interface
	nodeName string
	opts     Options
	nodeRef  *metav1.OwnerReference
	// reported remembers which unmatched devices were reported, keyed by UUID and health.
	reported map[string]health.Severity
	// taken remembers the rule names NameTaken was called for.
	taken map[string]bool

	// devices comes from an informer cache of this node's ResourceSlices (watched with field
	// selectors the API server indexes). The rules are not watched: DeviceTaintRules are
	// cluster-scoped and the API server cannot index a label selector, so every agent's watch would
	// receive every rule event of the cluster, N agents × M events per wave (the fleet test saw
	// the server drop hundreds of such watches). The syncer keeps its own view instead: listed
	// at start and every Relist, and updated with the object every write returns. The agent is
	// the only writer of its rules (the admission policy sees to that for other agents); a rule
	// someone deletes or edits by hand is repaired at the next relist, and a write that finds
	// the view wrong (a conflict, a rule already there or gone) relists at once.
	devices *dradevices.Index
	view    map[string]*resourceapi.DeviceTaintRule // by name
	fresh   bool                                    // false: list before the next Sync uses view
	listed  time.Time
}

var (
	_ report.Syncer  = (*Syncer)(nil)
	_ report.Starter = (*Syncer)(nil)
)

// New returns a Syncer for nodeName.
func New(client kube.Interface, nodeName string, opts Options) *Syncer {
	if opts.Driver == "" {
		opts.Driver = nvidia.DriverName
	}
	attrs := opts.attributes()
	opts.UUIDAttribute, opts.ParentUUIDAttribute, opts.PCIBusIDAttribute = attrs.UUID, attrs.ParentUUID, attrs.PCIBusID
	if opts.Relist <= 0 {
		opts.Relist = 5 * time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Syncer{client: client, nodeName: nodeName, opts: opts, reported: map[string]health.Severity{}, taken: map[string]bool{}}
}

func (o Options) attributes() dra.Attributes {
	return dra.Attributes{UUID: o.UUIDAttribute, ParentUUID: o.ParentUUIDAttribute, PCIBusID: o.PCIBusIDAttribute}.WithDefaults()
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "devicetaint" }

// Start fills the cache of this node's ResourceSlices (a driver may publish them after the agent
// starts) and asks for a Sync on any change to them. Malformed attribute names are an error here.
func (s *Syncer) Start(ctx context.Context, trigger func()) error {
	devices, err := dradevices.Attach(ctx, s.opts.Devices, dradevices.Source{Client: s.client, Node: s.nodeName, Driver: s.opts.Driver, Attributes: s.opts.attributes()}, trigger)
	if err != nil {
		return fmt.Errorf("devicetaint: %w", err)
	}
	s.devices = devices
	if st, ok := s.opts.Breaker.(interface {
		Start(context.Context, func()) error
	}); ok {
		if err := st.Start(ctx, trigger); err != nil {
			return err
		}
	}
	return nil
}

// Sync implements report.Syncer. It takes four steps, each in a file of its own: the rules this
// snapshot asks for (desired.go), the rules the node has (view.go), the circuit breaker's word on
// every escalation (breaker.go) and the writes that make the second match the first (write.go).
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	if s.devices == nil {
		return 0, errors.New("devicetaint: Sync before Start")
	}
	desired, err := s.desired(ctx, snap)
	if err != nil {
		return 0, err
	}
	existing, err := s.existing(ctx)
	if err != nil {
		return 0, err
	}
	breakerErr := s.applyBreaker(ctx, desired, existing)
	writes, err := s.write(ctx, desired, existing)
	return writes, errors.Join(breakerErr, err)
}
