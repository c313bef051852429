package breaker

import (
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
// creating its Lease (or taking over one that no longer counts, by an update on the version
// read), which the API server does atomically, so two holders never share a slot and holders
// racing for different slots do not conflict. The circuit breaker counts its slots by age
// (Slot.Live); remediation gives its slots a duration (Slot.Expires) and releases them.
type SlotPool struct {
	Client       kube.Interface
	Namespace    string
	Prefix       string
	Label        string
	FieldManager string
}

// breakerSlots is the circuit breaker's pool in namespace.
func breakerSlots(client kube.Interface, namespace string) SlotPool {
	return SlotPool{Client: client, Namespace: namespace, Prefix: SlotPrefix, Label: SlotLabel, FieldManager: "gpuhealth-agent"}
}

// List returns every slot Lease of the pool, live or not, by index.
func (p SlotPool) List(ctx context.Context) ([]Slot, error) {
	list, err := p.Client.CoordinationV1().Leases(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: p.Label})
	if err != nil {
		return nil, fmt.Errorf("list the %s* slots: %w", p.Prefix, err)
	}
	var slots []Slot
	for i := range list.Items {
		l := &list.Items[i]
		idx, err := strconv.Atoi(strings.TrimPrefix(l.Name, p.Prefix))
		if err != nil || !strings.HasPrefix(l.Name, p.Prefix) {
			continue
		}
		s := Slot{Index: idx, lease: l}
		s.Node, s.UUID, _ = strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "/")
		if l.Spec.AcquireTime != nil {
			s.At = l.Spec.AcquireTime.Time
		}
		if d := l.Spec.LeaseDurationSeconds; d != nil && l.Spec.AcquireTime != nil {
			s.Expires = s.At.Add(time.Duration(*d) * time.Second)
		}
		slots = append(slots, s)
	}
	slices.SortFunc(slots, func(a, b Slot) int { return a.Index - b.Index })
	return slots, nil
}

// Take tries to hold slot k for holder from now, for duration (zero: no expiry): create it when
// it is not in taken, take it over otherwise. It reports whether it got the slot; losing a race
// is not an error.
func (p SlotPool) Take(ctx context.Context, k int, taken map[int]Slot, holder string, now time.Time, duration time.Duration) (bool, error) {
	leases := p.Client.CoordinationV1().Leases(p.Namespace)
	spec := coordinationv1.LeaseSpec{HolderIdentity: &holder, AcquireTime: ptr.To(metav1.NewMicroTime(now))}
	if duration > 0 {
		spec.LeaseDurationSeconds = ptr.To(int32(max(1, duration/time.Second)))
		spec.RenewTime = spec.AcquireTime
	}
	var err error
	if s, ok := taken[k]; ok {
		l := s.lease.DeepCopy()
		l.Spec = spec
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{FieldManager: p.FieldManager})
	} else {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: p.Prefix + strconv.Itoa(k), Namespace: p.Namespace,
				Labels: map[string]string{p.Label: "true", "app.kubernetes.io/managed-by": "gpuhealth"}},
			Spec: spec,
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{FieldManager: p.FieldManager})
	}
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return false, nil // someone else got there first
	default:
		return false, fmt.Errorf("take slot %s%d: %w", p.Prefix, k, err)
	}
}

// Release deletes a slot, only if it is still the version listed: a slot someone took over since
// is theirs.
func (p SlotPool) Release(ctx context.Context, s Slot) error {
	err := p.Client.CoordinationV1().Leases(p.Namespace).Delete(ctx, s.lease.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &s.lease.UID, ResourceVersion: &s.lease.ResourceVersion},
	})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("release slot %s: %w", s.lease.Name, err)
}
