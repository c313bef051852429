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
// Rules are labelled with the node and the GPU UUID and owned by the Node, so they go away with
// it. A GPU with no matching DRA device is reported through Options.Unmatched, never an error.
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
	"maps"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Labels on every rule.
const (
	NodeLabel      = "gpuhealth.dev/node"
	UUIDLabel      = "gpuhealth.dev/gpu-uuid"
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "gpuhealth"
	TaintKeyPrefix = dra.TaintKeyPrefix
	DefaultDriver  = "gpu.nvidia.com"
	DefaultUUIDKey = dradevices.DefaultUUIDAttribute
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
	client   kubernetes.Interface
	nodeName string
	opts     Options
	nodeRef  *metav1.OwnerReference
	// reported remembers which unmatched devices were reported, keyed by UUID and health.
	reported map[string]health.Severity

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
func New(client kubernetes.Interface, nodeName string, opts Options) *Syncer {
	if opts.Driver == "" {
		opts.Driver = DefaultDriver
	}
	attrs := opts.attributes()
	opts.UUIDAttribute, opts.ParentUUIDAttribute, opts.PCIBusIDAttribute = attrs.UUID, attrs.ParentUUID, attrs.PCIBusID
	if opts.Relist <= 0 {
		opts.Relist = 5 * time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Syncer{client: client, nodeName: nodeName, opts: opts, reported: map[string]health.Severity{}}
}

func (o Options) attributes() dradevices.Attributes {
	return dradevices.Attributes{UUID: o.UUIDAttribute, ParentUUID: o.ParentUUIDAttribute, PCIBusID: o.PCIBusIDAttribute}.WithDefaults()
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "devicetaint" }

// Start fills the cache of this node's ResourceSlices (a driver may publish them after the agent
// starts) and asks for a Sync on any change to them. Malformed attribute names are an error here.
func (s *Syncer) Start(ctx context.Context, trigger func()) error {
	devices, err := dradevices.Attach(ctx, s.opts.Devices, s.client, s.nodeName, s.opts.Driver, s.opts.attributes(), trigger)
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

// relist replaces the view with this node's rules as the API server has them.
func (s *Syncer) relist(ctx context.Context) error {
	now := s.opts.Clock.Now()
	list, err := s.client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{NodeLabel: s.nodeName}).String(),
	})
	if err != nil {
		return fmt.Errorf("list DeviceTaintRules: %w", err)
	}
	s.view = make(map[string]*resourceapi.DeviceTaintRule, len(list.Items))
	for i := range list.Items {
		s.view[list.Items[i].Name] = &list.Items[i]
	}
	s.listed, s.fresh = now, true
	return nil
}

// stale makes the next Sync list the rules again: a write found the view wrong.
func (s *Syncer) stale() { s.fresh = false }

// Sync implements report.Syncer.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	if s.devices == nil {
		return 0, errors.New("devicetaint: Sync before Start")
	}
	if err := s.ensureNodeRef(ctx); err != nil {
		return 0, err
	}
	catalog, err := s.devices.Catalog(ctx)
	if err != nil {
		return 0, err
	}
	desired := s.desiredRules(ctx, snap, catalog)
	if !s.fresh || s.opts.Clock.Since(s.listed) >= s.opts.Relist {
		if err := s.relist(ctx); err != nil {
			return 0, err
		}
	}
	existing := slices.SortedFunc(maps.Values(s.view), func(a, b *resourceapi.DeviceTaintRule) int { return strings.Compare(a.Name, b.Name) })
	var errs []error
	if s.opts.Breaker != nil {
		errs = append(errs, s.applyBreaker(ctx, desired, existing))
	}
	writes, err := s.write(ctx, desired, existing)
	return writes, errors.Join(append(errs, err)...)
}

// write deletes the existing rules that are not desired, updates those that differ and creates
// the missing ones, keeping the view in step; it returns the writes made. desired is consumed.
func (s *Syncer) write(ctx context.Context, desired map[string]*resourceapi.DeviceTaintRule, existing []*resourceapi.DeviceTaintRule) (int, error) {
	var errs []error
	writes := 0
	rules := s.client.ResourceV1().DeviceTaintRules()
	for _, have := range existing {
		want, ok := desired[have.Name]
		delete(desired, have.Name)
		if !ok {
			err := rules.Delete(ctx, have.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &have.UID}})
			switch {
			case apierrors.IsNotFound(err):
				// Already gone: someone deleted it by hand.
				delete(s.view, have.Name)
			case err != nil:
				// A conflict means another rule of that name replaced ours: look again.
				s.stale()
				errs = append(errs, fmt.Errorf("delete DeviceTaintRule %s: %w", have.Name, err))
			default:
				delete(s.view, have.Name)
				writes++
			}
			continue
		}
		n, err := s.update(ctx, have, want)
		writes += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	n, err := s.create(ctx, desired)
	return writes + n, errors.Join(append(errs, err)...)
}

// create creates the missing rules, in name order; it returns the writes made.
func (s *Syncer) create(ctx context.Context, missing map[string]*resourceapi.DeviceTaintRule) (int, error) {
	var errs []error
	writes := 0
	rules := s.client.ResourceV1().DeviceTaintRules()
	for _, name := range slices.Sorted(maps.Keys(missing)) {
		want := missing[name]
		created, err := rules.Create(ctx, want, metav1.CreateOptions{FieldManager: "gpuhealth-agent"})
		if apierrors.IsAlreadyExists(err) {
			// Someone created it after the last list: compare with the real one.
			have, getErr := rules.Get(ctx, want.Name, metav1.GetOptions{})
			if getErr != nil {
				s.stale()
				errs = append(errs, fmt.Errorf("get DeviceTaintRule %s: %w", want.Name, getErr))
				continue
			}
			n, err := s.update(ctx, have, want)
			writes += n
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("create DeviceTaintRule %s: %w", want.Name, err))
			continue
		}
		s.view[created.Name] = created
		writes++
	}
	return writes, errors.Join(errs...)
}

// update makes have look like want, if it does not already; it returns the writes made. The view
// gets the rule as the API server has it afterwards.
func (s *Syncer) update(ctx context.Context, have, want *resourceapi.DeviceTaintRule) (int, error) {
	if same(have, want) {
		s.view[have.Name] = have
		return 0, nil
	}
	updated := have.DeepCopy()
	updated.Labels = want.Labels
	updated.OwnerReferences = want.OwnerReferences
	updated.Spec.DeviceSelector = want.Spec.DeviceSelector
	updated.Spec.Taint.Key, updated.Spec.Taint.Value = want.Spec.Taint.Key, want.Spec.Taint.Value
	if updated.Spec.Taint.Effect != want.Spec.Taint.Effect {
		updated.Spec.Taint.Effect = want.Spec.Taint.Effect
		updated.Spec.Taint.TimeAdded = nil // the effect changed: the server stamps the time
	}
	got, err := s.client.ResourceV1().DeviceTaintRules().Update(ctx, updated, metav1.UpdateOptions{FieldManager: "gpuhealth-agent"})
	if err != nil {
		// A conflict or a rule gone: someone else changed it; list again before retrying.
		s.stale()
		return 0, fmt.Errorf("update DeviceTaintRule %s: %w", have.Name, err)
	}
	s.view[got.Name] = got
	return 1, nil
}

func (s *Syncer) ensureNodeRef(ctx context.Context) error {
	if s.nodeRef != nil {
		return nil
	}
	node, err := s.client.CoreV1().Nodes().Get(ctx, s.nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", s.nodeName, err)
	}
	s.nodeRef = &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
	return nil
}

func same(have, want *resourceapi.DeviceTaintRule) bool {
	hs, ws := have.Spec.DeviceSelector, want.Spec.DeviceSelector
	return maps.Equal(have.Labels, want.Labels) &&
		len(have.OwnerReferences) == 1 && have.OwnerReferences[0].UID == want.OwnerReferences[0].UID &&
		hs != nil && eq(hs.Driver, ws.Driver) && eq(hs.Pool, ws.Pool) && eq(hs.Device, ws.Device) &&
		have.Spec.Taint.Key == want.Spec.Taint.Key && have.Spec.Taint.Value == want.Spec.Taint.Value &&
		have.Spec.Taint.Effect == want.Spec.Taint.Effect
}

func eq(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
