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
package claimstatus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	metav1apply "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/internal/report/dradevices"
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
	// Driver and UUIDAttribute find this node's GPUs among DRA devices, as for DeviceTaintRules.
	Driver, UUIDAttribute string
	Clock                 clock.PassiveClock
}

// Syncer keeps the GPU health conditions of the claims allocated on one node.
type Syncer struct {
	client   kubernetes.Interface
	nodeName string
	opts     Options
	claims   resourcelisters.ResourceClaimLister
	devices  *dradevices.Index
}

var (
	_ report.Syncer  = (*Syncer)(nil)
	_ report.Starter = (*Syncer)(nil)
)

// New returns a Syncer for nodeName.
func New(client kubernetes.Interface, nodeName string, opts Options) *Syncer {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Syncer{client: client, nodeName: nodeName, opts: opts}
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "claimstatus" }

// Start fills the caches of claims (allocations come and go) and of this node's slices.
func (s *Syncer) Start(ctx context.Context, trigger func()) error {
	devices, err := dradevices.Start(ctx, s.client, s.nodeName, s.opts.Driver, s.opts.UUIDAttribute, trigger)
	if err != nil {
		return fmt.Errorf("claimstatus: %w", err)
	}
	claimFactory := informers.NewSharedInformerFactory(s.client, 0)
	claimInformer := claimFactory.Resource().V1().ResourceClaims()
	if _, err := claimInformer.Informer().AddEventHandler(dradevices.OnAnyChange(trigger)); err != nil {
		return err
	}
	s.claims, s.devices = claimInformer.Lister(), devices
	claimFactory.Start(ctx.Done())
	for typ, ok := range claimFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("claimstatus: cache of %v did not sync", typ)
		}
	}
	return nil
}

// deviceKey names a DRA device.
type deviceKey = dradevices.Device

// Sync implements report.Syncer.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	if s.claims == nil || s.devices == nil {
		return 0, errors.New("claimstatus: Sync before Start")
	}
	uuidOf, err := s.devices.UUIDs()
	if err != nil {
		return 0, err
	}
	byUUID := make(map[string]health.DeviceStatus, len(snap.Devices))
	for _, d := range snap.Devices {
		byUUID[strings.ToLower(d.Device.UUID)] = d
	}
	claims, err := s.claims.List(labels.Everything())
	if err != nil {
		return 0, err
	}
	writes := 0
	var errs []error
	for _, claim := range claims {
		if claim.Status.Allocation == nil && !hasOurConditions(claim) {
			continue
		}
		desired := s.desired(claim, uuidOf, byUUID)
		if !s.differs(claim, uuidOf, desired) {
			continue
		}
		if err := s.apply(ctx, claim, desired); err != nil {
			if apierrors.IsNotFound(err) {
				continue // the claim is gone
			}
			errs = append(errs, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err))
			continue
		}
		writes++
	}
	return writes, errors.Join(errs...)
}

// desired returns, for each device of this node the claim holds whose GPU is not Healthy, the
// condition it should carry.
func (s *Syncer) desired(claim *resourceapi.ResourceClaim, uuidOf map[deviceKey]string, byUUID map[string]health.DeviceStatus) map[deviceKey]metav1.Condition {
	out := map[deviceKey]metav1.Condition{}
	if claim.Status.Allocation == nil {
		return out
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != s.opts.Driver {
			continue
		}
		key := deviceKey{Pool: r.Pool, Name: r.Device}
		uuid, ok := uuidOf[key]
		if !ok {
			continue
		}
		d, ok := byUUID[uuid]
		if !ok || d.Health == health.Healthy {
			continue
		}
		out[key] = condition(d)
	}
	return out
}

func condition(d health.DeviceStatus) metav1.Condition {
	reason := ReasonDegraded
	if d.Health == health.Unhealthy {
		reason = ReasonUnhealthy
	}
	var parts []string
	for _, c := range report.WorstFirst(d.Conditions) {
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
func current(claim *resourceapi.ResourceClaim, uuidOf map[deviceKey]string, driver string) map[deviceKey]metav1.Condition {
	out := map[deviceKey]metav1.Condition{}
	for _, ds := range claim.Status.Devices {
		key := deviceKey{Pool: ds.Pool, Name: ds.Device}
		if _, mine := uuidOf[key]; !mine || ds.Driver != driver {
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

func (s *Syncer) differs(claim *resourceapi.ResourceClaim, uuidOf map[deviceKey]string, desired map[deviceKey]metav1.Condition) bool {
	have := current(claim, uuidOf, s.opts.Driver)
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
func (s *Syncer) apply(ctx context.Context, claim *resourceapi.ResourceClaim, desired map[deviceKey]metav1.Condition) error {
	have := current(claim, s.knownDevices(claim), s.opts.Driver)
	keys := make([]deviceKey, 0, len(desired))
	for k := range desired {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b deviceKey) int { return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Name, b.Name)) })
	now := metav1.NewTime(s.opts.Clock.Now())
	status := resourceapply.ResourceClaimStatus()
	for _, k := range keys {
		want := desired[k]
		since := now
		if got, ok := have[k]; ok && got.Status == want.Status {
			since = got.LastTransitionTime
		}
		status.WithDevices(resourceapply.AllocatedDeviceStatus().
			WithDriver(s.opts.Driver).WithPool(k.Pool).WithDevice(k.Name).
			WithConditions(metav1apply.Condition().
				WithType(want.Type).WithStatus(want.Status).WithReason(want.Reason).WithMessage(want.Message).
				WithLastTransitionTime(since).WithObservedGeneration(claim.Generation)))
	}
	ac := resourceapply.ResourceClaim(claim.Name, claim.Namespace).WithStatus(status)
	_, err := s.client.ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	return err
}

// knownDevices is every device the claim's status mentions, for reading transition times.
func (s *Syncer) knownDevices(claim *resourceapi.ResourceClaim) map[deviceKey]string {
	out := map[deviceKey]string{}
	for _, ds := range claim.Status.Devices {
		out[deviceKey{Pool: ds.Pool, Name: ds.Device}] = ""
	}
	return out
}
