// Package claimstatus reports GPU health where a workload's owner looks: in the status of the
// ResourceClaims that hold the GPU. For each claim allocated a device of this node whose GPU is
// not Healthy, it keeps one condition in status.devices[] for that device:
//
//	type:    gpuhealth.dev/GPUHealthy
//	status:  False
//	reason:  Unhealthy or Degraded
//	message: the GPU's reasons and what it asks for ("XID79: XID 79: GPU has fallen off the bus;
//	         eviction requested")
//
// and removes it when the GPU recovers. Writes are server-side apply with one field manager,
// batched per claim (all of a claim's devices on this node in one apply), so several devices never
// fight over ownership and the DRA driver's own entries and conditions are left alone. The API
// server also requires the per-driver synthetic permission resourceclaims/driver
// (associated-node:patch for an agent whose token is bound to a pod on the claim's node).
//
// The claims are found where the kubelet keeps them: its pod-resources API names, for every
// container on the node, the DRA claims it was prepared with (claims.go), so the agent needs no
// permission to read pods, and reads by name only the claims of its own node. ResourceClaims
// cannot be selected by node, and neither can a reader of pods be confined to one node's: a pod
// watch (Options.PodWatch, for kubelets that do not name claims) needs cluster-wide pods
// list/watch. Claims are read with a GET only when there is something to check: the node's
// claims once after start (conditions left by an earlier run) and, while a GPU is not Healthy,
// when they come to the node or the conditions they should carry change; the claims that carry
// our condition when it should change; and all of those again every Options.Recheck. A node
// without DRA devices of the driver (device plugins only) looks for no claims at all.
package claimstatus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Condition and field manager.
const (
	ConditionType   = "gpuhealth.dev/GPUHealthy"
	ReasonUnhealthy = "Unhealthy"
	ReasonDegraded  = "Degraded"
	FieldManager    = "gpuhealth-agent"
	// EventUnavailable is the reason of the Warning Event on the Node saying that the claims of
	// its pods cannot be found, and why.
	EventUnavailable = "ClaimStatusUnavailable"
)

// Defaults of Options.
const (
	DefaultPoll    = 10 * time.Second
	DefaultRecheck = 5 * time.Minute
	// RetryUnavailable is how often a syncer that cannot find the node's claims tries again
	// while every GPU is Healthy (while one is not, every Poll).
	RetryUnavailable = time.Minute
)

// Options configure a Syncer.
type Options struct {
	// Driver and the attributes find this node's GPUs among DRA devices, as for DeviceTaintRules
	// (empty attribute names take the NVIDIA driver's, see dra.Attributes): a claim holding
	// a MIG partition or the VFIO device of a sick GPU is marked too.
	Driver, UUIDAttribute, ParentUUIDAttribute, PCIBusIDAttribute string
	// Devices, when set, is the agent's shared index of this node's DRA devices (of Driver and
	// the same attributes); nil gives the syncer one of its own.
	Devices *dradevices.Index
	// PodResources is the kubelet's pod-resources API (podresources.Socket), which names the
	// claims of the node's pods. Required unless PodWatch.
	PodResources PodResourcesLister
	// PodWatch finds the claims through a watch of the pods bound to the node instead (it needs
	// cluster-wide pods list/watch): for kubelets that do not name claims in pod-resources.
	PodWatch bool
	// Nodes gives this node's Node, whose kubelet version says whether the kubelet names claims
	// (nodecache.Cache does); nil reads it from the API server when needed.
	Nodes NodeGetter
	// Unavailable, when set, hears once per cause that the node's claims cannot be found, and
	// why (the agent posts it as a Warning Event on its Node). Syncs go on, without them.
	Unavailable func(why string)
	// Unmarked, when set, hears each sync that has a GPU to mark and cannot find the node's
	// claims (the agent counts it in gpuhealth_unmatched_devices_total).
	Unmarked func()
	// Poll is how often the node's claims are looked for again while a GPU is not Healthy, for
	// pods that start on it (default DefaultPoll; not with PodWatch, whose watch says so).
	Poll time.Duration
	// Recheck is how often every claim to check is read again although nothing changed, to
	// repair what someone else changed (default DefaultRecheck).
	Recheck time.Duration
	// Clock stamps the conditions' lastTransitionTime and paces the syncs (default the real
	// clock).
	Clock clock.PassiveClock
}

// Syncer keeps the GPU health conditions of the claims allocated on one node.
type Syncer struct {
	client   kube.Interface
	nodeName string
	opts     Options
	finder   claimFinder
	devices  *dradevices.Index
	// marked holds the claims that carry our condition, as far as this syncer knows; nil until a
	// Sync has checked every claim on the node.
	marked map[types.NamespacedName]bool
	// checked holds, for each claim read since checkedAt, the fingerprint of the conditions it
	// was checked against: it needs no new read while they stay the same.
	checked   map[types.NamespacedName]uint64
	checkedAt time.Time
	// sick: the last Sync had a DRA device to mark; unavailable: why the node's claims could not
	// be found in the last Sync that looked ("" when they could).
	sick        bool
	unavailable string
}

var (
	_ report.Syncer  = (*Syncer)(nil)
	_ report.Starter = (*Syncer)(nil)
	_ report.Pacer   = (*Syncer)(nil)
)

// New returns a Syncer for nodeName.
func New(client kube.Interface, nodeName string, opts Options) *Syncer {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	opts.Poll = cmp.Or(opts.Poll, DefaultPoll)
	opts.Recheck = cmp.Or(opts.Recheck, DefaultRecheck)
	return &Syncer{client: client, nodeName: nodeName, opts: opts, checked: map[types.NamespacedName]uint64{}}
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "claimstatus" }

// Start fills the cache of this node's DRA devices and, with PodWatch, of its pods.
func (s *Syncer) Start(ctx context.Context, trigger func()) error {
	attrs := dra.Attributes{UUID: s.opts.UUIDAttribute, ParentUUID: s.opts.ParentUUIDAttribute, PCIBusID: s.opts.PCIBusIDAttribute}
	devices, err := dradevices.Attach(ctx, s.opts.Devices, dradevices.Source{Client: s.client, Node: s.nodeName, Driver: s.opts.Driver, Attributes: attrs}, trigger)
	if err != nil {
		return fmt.Errorf("claimstatus: %w", err)
	}
	logger := klog.FromContext(ctx)
	switch {
	case s.opts.PodWatch:
		pods, err := watchPods(ctx, s.client, s.nodeName, trigger)
		if err != nil {
			return fmt.Errorf("claimstatus: %w", err)
		}
		s.finder = pods
		logger.Info("Finding the ResourceClaims of this node's pods through a watch of its pods (agent.claimStatus.podWatch)")
	case s.opts.PodResources != nil:
		s.finder = &kubeletClaims{lister: s.opts.PodResources, node: s.node}
		logger.V(1).Info("Finding the ResourceClaims of this node's pods through the kubelet's pod-resources API")
	default:
		return errors.New("claimstatus: neither the kubelet's pod-resources API nor a pod watch to find claims by")
	}
	s.devices = devices
	return nil
}

// node returns this node's Node.
func (s *Syncer) node(ctx context.Context) (*corev1.Node, error) {
	if s.opts.Nodes != nil {
		return s.opts.Nodes.Get(ctx)
	}
	return s.client.CoreV1().Nodes().Get(ctx, s.nodeName, metav1.GetOptions{})
}

// NextSync implements report.Pacer: while a GPU is not Healthy the kubelet is asked again every
// Poll for claims that came to the node (a pod watch hears of them by itself), and while the
// node's claims cannot be found, every RetryUnavailable.
func (s *Syncer) NextSync() time.Time {
	now := s.opts.Clock.Now()
	switch {
	case s.sick && !s.opts.PodWatch:
		return now.Add(s.opts.Poll)
	case s.unavailable != "":
		return now.Add(RetryUnavailable)
	}
	return time.Time{}
}

// Sync implements report.Syncer.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	if s.finder == nil || s.devices == nil {
		return 0, errors.New("claimstatus: Sync before Start")
	}
	catalog, err := s.devices.Catalog(ctx)
	if err != nil {
		return 0, err
	}
	if catalog.PhysicalGPUs() == 0 {
		// No DRA device of this node and driver (a device-plugin node): no claim can hold one,
		// and nothing needs finding.
		s.sick = false
		return 0, nil
	}
	assigned, _ := catalog.Assign(snap)
	s.sick = len(assigned) > 0
	fp := fingerprint(assigned)
	if now := s.opts.Clock.Now(); s.checkedAt.IsZero() || now.Sub(s.checkedAt) >= s.opts.Recheck {
		clear(s.checked)
		s.checkedAt = now
	}
	// Which claims to read: those on the node that may need a condition (while a device is to
	// be marked, and all of them once after start) and those that carry one, unless already
	// checked against the same conditions.
	var onNode map[types.NamespacedName]bool
	if s.sick || s.marked == nil {
		if onNode, err = s.findClaims(ctx); err != nil {
			return 0, err
		}
	}
	marked := s.marked
	if marked == nil {
		marked = map[types.NamespacedName]bool{}
	}
	for key := range s.checked {
		if !onNode[key] && !marked[key] {
			delete(s.checked, key)
		}
	}
	check := map[types.NamespacedName]bool{}
	for key := range onNode {
		check[key] = true
	}
	for key := range marked {
		check[key] = true
	}
	keys := slices.SortedFunc(maps.Keys(check), func(a, b types.NamespacedName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	writes := 0
	var errs []error
	for _, key := range keys {
		if got, ok := s.checked[key]; ok && got == fp {
			continue
		}
		wrote, err := s.syncClaim(ctx, key, catalog, assigned, marked)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.checked[key] = fp
		if wrote {
			writes++
		}
	}
	if s.marked != nil || (onNode != nil && len(errs) == 0) {
		// After start, only a round that found the node's claims and read them all without
		// errors has seen every claim.
		s.marked = marked
	}
	return writes, errors.Join(errs...)
}

// findClaims returns the claims of the pods on this node, or nil when they cannot be found (said
// once per cause), or an error worth a retry.
func (s *Syncer) findClaims(ctx context.Context) (map[types.NamespacedName]bool, error) {
	logger := klog.FromContext(ctx)
	claims, err := s.finder.claims(ctx)
	var u unavailableError
	switch {
	case errors.As(err, &u):
		if s.unavailable != u.why {
			s.unavailable = u.why
			logger.Error(err, "Cannot find the ResourceClaims of this node's pods: claims holding a GPU that is not Healthy get no condition until they can be found")
			if s.opts.Unavailable != nil {
				s.opts.Unavailable(u.why)
			}
		}
		if s.sick && s.opts.Unmarked != nil {
			s.opts.Unmarked()
		}
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("find the claims of the pods on %s: %w", s.nodeName, err)
	}
	if s.unavailable != "" {
		logger.Info("Found the ResourceClaims of this node's pods again", "claims", len(claims))
		s.unavailable = ""
	}
	return claims, nil
}

// syncClaim reads one claim and writes its conditions where they differ from what they should
// be; it keeps marked up to date and says whether it wrote.
func (s *Syncer) syncClaim(ctx context.Context, key types.NamespacedName, catalog *dra.Catalog, assigned map[dra.DeviceID]dra.Assignment, marked map[types.NamespacedName]bool) (bool, error) {
	claim, err := s.client.ResourceV1().ResourceClaims(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		delete(marked, key) // the claim is gone
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get claim %s: %w", key, err)
	}
	if claim.Status.Allocation == nil && !hasOurConditions(claim) {
		delete(marked, key)
		return false, nil
	}
	desired := s.desired(claim, assigned)
	if !s.differs(claim, catalog, desired) {
		setMark(marked, key, hasOurConditions(claim))
		return false, nil
	}
	if err := s.apply(ctx, claim, desired); err != nil {
		if apierrors.IsNotFound(err) {
			delete(marked, key)
			return false, nil
		}
		return false, fmt.Errorf("claim %s: %w", key, err)
	}
	setMark(marked, key, len(desired) > 0)
	return true, nil
}

func setMark(marked map[types.NamespacedName]bool, key types.NamespacedName, on bool) {
	if on {
		marked[key] = true
	} else {
		delete(marked, key)
	}
}

// fingerprint identifies the conditions the node's DRA devices should carry: a claim checked
// against the same fingerprint needs no new read.
func fingerprint(assigned map[dra.DeviceID]dra.Assignment) uint64 {
	keys := slices.SortedFunc(maps.Keys(assigned), func(a, b dra.DeviceID) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Device, b.Device))
	})
	h := fnv.New64a()
	for _, k := range keys {
		c := condition(assigned[k].Status)
		for _, part := range []string{k.Pool, k.Device, c.Reason, c.Message} {
			_, _ = h.Write([]byte(part))
			_, _ = h.Write([]byte{0})
		}
	}
	return h.Sum64()
}
