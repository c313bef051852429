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
// The claims are found as the kubelet finds them: through the pods bound to this node (one watch
// selected by spec.nodeName, a selector the API server indexes) and the claims those pods use.
// ResourceClaims cannot be selected by node, and a cluster-wide claim watch in every agent would
// cache every claim of the cluster on every node and cost the API server one dispatch per agent
// for every claim event. Claims are read with a GET only when there is something to check: while
// a GPU of the node is not Healthy, for claims that still carry our condition, and once after
// start for every claim on the node (conditions left by an earlier run).
package claimstatus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

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
	// Clock stamps the conditions' lastTransitionTime (default the real clock).
	Clock clock.PassiveClock
}

// Syncer keeps the GPU health conditions of the claims allocated on one node.
type Syncer struct {
	client   kube.Interface
	nodeName string
	opts     Options
	pods     corelisters.PodLister
	devices  *dradevices.Index
	// marked holds the claims that carry our condition, as far as this syncer knows; nil until a
	// Sync has checked every claim on the node.
	marked map[types.NamespacedName]bool
}

var (
	_ report.Syncer  = (*Syncer)(nil)
	_ report.Starter = (*Syncer)(nil)
)

// New returns a Syncer for nodeName.
func New(client kube.Interface, nodeName string, opts Options) *Syncer {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Syncer{client: client, nodeName: nodeName, opts: opts}
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "claimstatus" }

// Start fills the caches of this node's pods (claims come and go with them) and slices.
func (s *Syncer) Start(ctx context.Context, trigger func()) error {
	attrs := dra.Attributes{UUID: s.opts.UUIDAttribute, ParentUUID: s.opts.ParentUUIDAttribute, PCIBusID: s.opts.PCIBusIDAttribute}
	devices, err := dradevices.Attach(ctx, s.opts.Devices, dradevices.Source{Client: s.client, Node: s.nodeName, Driver: s.opts.Driver, Attributes: attrs}, trigger)
	if err != nil {
		return fmt.Errorf("claimstatus: %w", err)
	}
	var informers kube.Informers
	podInformer := informers.Add(kube.NewInformer(s.client, s.client.CoreV1().Pods(""), &corev1.Pod{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", s.nodeName).String()
	}))
	// Only the pod's name and claims are kept: the cache holds every pod of the node.
	if err := podInformer.SetTransform(claimsOnly); err != nil {
		return err
	}
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); !ok || len(dra.PodClaimNames(pod)) > 0 {
				trigger()
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Pod)
			n, ok2 := newObj.(*corev1.Pod)
			if !ok1 || !ok2 || !slices.Equal(dra.PodClaimNames(o), dra.PodClaimNames(n)) {
				trigger()
			}
		},
		DeleteFunc: func(any) { trigger() },
	}); err != nil {
		return err
	}
	s.pods, s.devices = corelisters.NewPodLister(podInformer.GetIndexer()), devices
	informers.Start(ctx)
	if err := informers.WaitForCacheSync(ctx); err != nil {
		return fmt.Errorf("claimstatus: %w", err)
	}
	return nil
}

// claimsOnly strips a pod down to what Sync reads.
func claimsOnly(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName, ResourceClaims: pod.Spec.ResourceClaims},
		Status: corev1.PodStatus{
			ResourceClaimStatuses:       pod.Status.ResourceClaimStatuses,
			ExtendedResourceClaimStatus: pod.Status.ExtendedResourceClaimStatus,
		},
	}, nil
}

// claimsOnNode returns the claims of the pods bound to this node.
func (s *Syncer) claimsOnNode() (map[types.NamespacedName]bool, error) {
	pods, err := s.pods.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := map[types.NamespacedName]bool{}
	for _, pod := range pods {
		if pod.Spec.NodeName != s.nodeName {
			continue
		}
		for _, name := range dra.PodClaimNames(pod) {
			out[types.NamespacedName{Namespace: pod.Namespace, Name: name}] = true
		}
	}
	return out, nil
}

// Sync implements report.Syncer.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	if s.pods == nil || s.devices == nil {
		return 0, errors.New("claimstatus: Sync before Start")
	}
	catalog, err := s.devices.Catalog(ctx)
	if err != nil {
		return 0, err
	}
	assigned, _ := catalog.Assign(snap)
	sick := slices.ContainsFunc(snap.Devices, func(d health.DeviceStatus) bool { return d.Health != health.Healthy })
	// Which claims to read: those that may need a condition (every claim on the node while a
	// GPU is not Healthy, and all of them once after start) and those that carry one.
	check := map[types.NamespacedName]bool{}
	if sick || s.marked == nil {
		if check, err = s.claimsOnNode(); err != nil {
			return 0, err
		}
	}
	marked := s.marked
	if marked == nil {
		marked = map[types.NamespacedName]bool{}
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
		claim, err := s.client.ResourceV1().ResourceClaims(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			delete(marked, key) // the claim is gone
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("get claim %s: %w", key, err))
			continue
		}
		if claim.Status.Allocation == nil && !hasOurConditions(claim) {
			delete(marked, key)
			continue
		}
		desired := s.desired(claim, assigned)
		if !s.differs(claim, catalog, desired) {
			setMark(marked, key, hasOurConditions(claim))
			continue
		}
		if err := s.apply(ctx, claim, desired); err != nil {
			if apierrors.IsNotFound(err) {
				delete(marked, key)
				continue
			}
			errs = append(errs, fmt.Errorf("claim %s: %w", key, err))
			continue
		}
		setMark(marked, key, len(desired) > 0)
		writes++
	}
	if s.marked != nil || len(errs) == 0 {
		// After start, only a round without errors has seen every claim.
		s.marked = marked
	}
	return writes, errors.Join(errs...)
}

func setMark(marked map[types.NamespacedName]bool, key types.NamespacedName, on bool) {
	if on {
		marked[key] = true
	} else {
		delete(marked, key)
	}
}

// desired returns, for each device of this node the claim holds whose GPU is not Healthy, the
// condition it should carry.
func (s *Syncer) desired(claim *resourceapi.ResourceClaim, assigned map[dra.DeviceID]dra.Assignment) map[dra.DeviceID]metav1.Condition {
	out := map[dra.DeviceID]metav1.Condition{}
	if claim.Status.Allocation == nil {
		return out
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != s.opts.Driver {
			continue
		}
		key := dra.DeviceID{Pool: r.Pool, Device: r.Device}
		if a, ok := assigned[key]; ok {
			out[key] = condition(a.Status)
		}
	}
	return out
}

func condition(d health.DeviceStatus) metav1.Condition {
	reason := ReasonDegraded
	if d.Health == health.Unhealthy {
		reason = ReasonUnhealthy
	}
	var parts []string
	for _, c := range health.WorstFirst(d.Conditions) {
		parts = append(parts, c.Reason+": "+c.Message)
	}
	msg := strings.Join(parts, "; ")
	if d.Evict {
		msg += "; eviction requested"
	}
	if len(msg) > 32*1024 {
		msg = msg[:32*1024]
	}
	return metav1.Condition{Type: ConditionType, Status: metav1.ConditionFalse, Reason: reason, Message: msg}
}

// current returns our conditions now in the claim's status, for this node's devices.
func current(claim *resourceapi.ResourceClaim, mine func(dra.DeviceID) bool, driver string) map[dra.DeviceID]metav1.Condition {
	out := map[dra.DeviceID]metav1.Condition{}
	for _, ds := range claim.Status.Devices {
		key := dra.DeviceID{Pool: ds.Pool, Device: ds.Device}
		if !mine(key) || ds.Driver != driver {
			continue
		}
		for _, c := range ds.Conditions {
			if c.Type == ConditionType {
				out[key] = c
			}
		}
	}
	return out
}

func hasOurConditions(claim *resourceapi.ResourceClaim) bool {
	for _, ds := range claim.Status.Devices {
		if slices.ContainsFunc(ds.Conditions, func(c metav1.Condition) bool { return c.Type == ConditionType }) {
			return true
		}
	}
	return false
}

func (s *Syncer) differs(claim *resourceapi.ResourceClaim, catalog *dra.Catalog, desired map[dra.DeviceID]metav1.Condition) bool {
	have := current(claim, catalog.Known, s.opts.Driver)
	if len(have) != len(desired) {
		return true
	}
	for key, want := range desired {
		got, ok := have[key]
		if !ok || got.Status != want.Status || got.Reason != want.Reason || got.Message != want.Message {
			return true
		}
	}
	return false
}

// apply writes every condition of the claim's devices on this node in one server-side apply;
// devices left out (all of them, on recovery) lose what this field manager owned, and server-side
// apply removes the entries nobody else owns.
func (s *Syncer) apply(ctx context.Context, claim *resourceapi.ResourceClaim, desired map[dra.DeviceID]metav1.Condition) error {
	have := current(claim, func(dra.DeviceID) bool { return true }, s.opts.Driver)
	keys := make([]dra.DeviceID, 0, len(desired))
	for k := range desired {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b dra.DeviceID) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Device, b.Device))
	})
	now := metav1.NewTime(s.opts.Clock.Now())
	body := claimStatusApply{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim"}
	body.Metadata.Name, body.Metadata.Namespace = claim.Name, claim.Namespace
	for _, k := range keys {
		want := desired[k]
		since := now
		if got, ok := have[k]; ok && got.Status == want.Status {
			since = got.LastTransitionTime
		}
		body.Status.Devices = append(body.Status.Devices, deviceStatusApply{
			Driver: s.opts.Driver, Pool: k.Pool, Device: k.Device,
			Conditions: []conditionApply{{
				Type: want.Type, Status: want.Status, Reason: want.Reason, Message: want.Message,
				LastTransitionTime: since, ObservedGeneration: claim.Generation,
			}},
		})
	}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	_, err = s.client.ResourceV1().ResourceClaims(claim.Namespace).Patch(ctx, claim.Name, types.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: FieldManager, Force: ptr.To(true)}, "status")
	return err
}

// claimStatusApply is the server-side apply configuration of a claim's device conditions, the
// fields client-go's ResourceClaim apply configuration would send (that package links every API
// group; see package kube).
type claimStatusApply struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Status struct {
		Devices []deviceStatusApply `json:"devices,omitempty"`
	} `json:"status"`
}

type deviceStatusApply struct {
	Driver     string           `json:"driver"`
	Pool       string           `json:"pool"`
	Device     string           `json:"device"`
	Conditions []conditionApply `json:"conditions"`
}

type conditionApply struct {
	Type               string                 `json:"type"`
	Status             metav1.ConditionStatus `json:"status"`
	ObservedGeneration int64                  `json:"observedGeneration"`
	LastTransitionTime metav1.Time            `json:"lastTransitionTime"`
	Reason             string                 `json:"reason"`
	Message            string                 `json:"message"`
}
