package breaker

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// SlotPool is a budget made of Lease slots, <Prefix><k>, labelled Label: taking slot k is
// creating its Lease, which the API server does atomically, so two holders never share a slot
// and holders racing for different slots do not conflict.
//
// A slot's time is the API server's: its creationTimestamp, never a time the holder wrote
// (acquireTime is written for people reading the Lease, and ignored). Otherwise one agent could
// date its slots 2099 and hold the budget forever, beyond the reach of an acknowledgement. For
// the same reason slots are never taken over by an update: a slot that stopped counting is
// deleted (by the breaker controller's Sweeper, or by its holder in a pool whose owners release)
// and created again, and the admission policy lets an agent create only slots that name its own
// node and delete only those. The circuit breaker counts its slots by age (Slot.Live); remediation gives
// its slots a duration (Slot.Expires) and releases them.
type SlotPool struct {
	Client    kube.Interface
	Namespace string
	Prefix    string
	Label     string
	// LabelValue is the value of Label on the pool's slots (default "true"); a pool with one
	// lists only the slots with that value, so pools can share a label.
	LabelValue   string
	FieldManager string
	// OwnerReleases: holders delete their own slots (remediation's, at the end of a repair, and
	// when one expired), so Take may delete its node's expired slot before taking it again.
	// Breaker slots are left to the Sweeper: agents are not granted delete on them.
	OwnerReleases bool
}

// breakerSlots is the circuit breaker's pool in namespace.
func BreakerSlots(client kube.Interface, namespace string) SlotPool {
	return SlotPool{Client: client, Namespace: namespace, Prefix: SlotPrefix, Label: SlotLabel, FieldManager: "gpuhealth-agent"}
}

// MaxSlotDuration is the longest a slot taken with a duration counts for, whatever its Lease
// says (the admission policy refuses longer ones from agents).
const MaxSlotDuration = 24 * time.Hour

// List returns every slot Lease of the pool, live or not, by index.
func (p SlotPool) List(ctx context.Context) ([]Slot, error) {
	selector := p.Label
	if p.LabelValue != "" {
		selector += "=" + p.LabelValue
	}
	list, err := p.Client.CoordinationV1().Leases(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("list the %s* slots: %w", p.Prefix, err)
	}
	return p.slots(list.Items), nil
}

// slots are the pool's slots among leases, by index.
func (p SlotPool) slots(leases []coordinationv1.Lease) []Slot {
	var slots []Slot
	for i := range leases {
		l := &leases[i]
		idx, err := strconv.Atoi(strings.TrimPrefix(l.Name, p.Prefix))
		if err != nil || idx < 0 || !strings.HasPrefix(l.Name, p.Prefix) {
			continue
		}
		s := Slot{Index: idx, At: l.CreationTimestamp.Time, lease: l}
		s.Node, s.UUID, _ = strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "/")
		if d := l.Spec.LeaseDurationSeconds; d != nil {
			s.Expires = s.At.Add(min(time.Duration(max(*d, 0))*time.Second, MaxSlotDuration))
		}
		slots = append(slots, s)
	}
	slices.SortFunc(slots, func(a, b Slot) int { return a.Index - b.Index })
	return slots
}

// SlotClaim is who takes a slot, when, and for how long.
type SlotClaim struct {
	// Node and UUID are the holder: the node and its GPU the slot is taken for.
	Node, UUID string
	// At is when the holder takes it (written for people reading the Lease; the slot's time is
	// the API server's).
	At time.Time
	// Duration is how long the slot counts (zero: no expiry).
	Duration time.Duration
}

// Take tries to hold slot k for claim c. taken is the pool as listed; a slot k in it must no
// longer count, and be c.Node's own in a pool whose owners release (Take deletes it first); any
// other is not Take's to delete (the Sweeper removes it), so Take reports false. It reports
// whether it got the slot; losing a race is not an error.
func (p SlotPool) Take(ctx context.Context, k int, taken map[int]Slot, c SlotClaim) (bool, error) {
	s, err := p.take(ctx, k, taken, c)
	return s != nil, err
}

// take is Take, returning the slot it took (nil: it lost the race) for a holder that may have
// to release it again.
func (p SlotPool) take(ctx context.Context, k int, taken map[int]Slot, c SlotClaim) (*Slot, error) {
	if s, ok := taken[k]; ok {
		if !p.OwnerReleases || s.Node != c.Node {
			return nil, nil
		}
		if err := p.Release(ctx, s); err != nil {
			return nil, err
		}
	}
	holder := Holder(c.Node, c.UUID)
	spec := coordinationv1.LeaseSpec{HolderIdentity: &holder, AcquireTime: ptr.To(metav1.NewMicroTime(c.At))}
	if c.Duration > 0 {
		spec.LeaseDurationSeconds = ptr.To(int32(max(1, c.Duration/time.Second)))
		spec.RenewTime = spec.AcquireTime
	}
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: p.Prefix + strconv.Itoa(k), Namespace: p.Namespace,
			Labels: map[string]string{p.Label: cmp.Or(p.LabelValue, "true"), "app.kubernetes.io/managed-by": "gpuhealth"}},
		Spec: spec,
	}
	created, err := p.Client.CoordinationV1().Leases(p.Namespace).Create(ctx, l, metav1.CreateOptions{FieldManager: p.FieldManager})
	switch {
	case err == nil:
		return &Slot{Index: k, Node: c.Node, UUID: c.UUID, At: created.CreationTimestamp.Time, lease: created}, nil
	case apierrors.IsAlreadyExists(err):
		return nil, nil // someone else got there first
	default:
		return nil, fmt.Errorf("take slot %s%d: %w", p.Prefix, k, err)
	}
}

// Release deletes a slot, only if it is still the version listed: a slot deleted and taken again
// since is someone else's.
func (p SlotPool) Release(ctx context.Context, s Slot) error {
	err := p.Client.CoordinationV1().Leases(p.Namespace).Delete(ctx, s.lease.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &s.lease.UID, ResourceVersion: &s.lease.ResourceVersion},
	})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("release slot %s: %w", s.lease.Name, err)
}

// Slot is one admission, read from its Lease.
type Slot struct {
	Index int
	Node  string
	UUID  string
	At    time.Time
	// Expires is when a slot taken with a duration stops counting (zero: never by itself).
	Expires time.Time
	lease   *coordinationv1.Lease
}

// Holder is what a slot's holderIdentity says: node/uuid.
func Holder(node, uuid string) string { return node + "/" + uuid }

// ListSlots returns every slot Lease in the namespace, live or not, by index.
func ListSlots(ctx context.Context, client kube.Interface, namespace string) ([]Slot, error) {
	return BreakerSlots(client, namespace).List(ctx)
}

// Live reports whether a slot still counts: taken after cutoff (the window's start or the last
// acknowledgement, whichever is later).
func (s Slot) Live(cutoff time.Time) bool { return s.At.After(cutoff) }

// Cutoff is the earliest time a slot must have been taken at to count.
func Cutoff(now time.Time, window time.Duration, acknowledged time.Time) time.Time {
	cutoff := now.Add(-window)
	if acknowledged.After(cutoff) {
		cutoff = acknowledged
	}
	return cutoff
}
