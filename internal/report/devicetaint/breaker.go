package devicetaint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// disruption ranks effects: None < NoSchedule < NoExecute.
func disruption(e resourceapi.DeviceTaintEffect) int {
	switch e {
	case resourceapi.DeviceTaintEffectNoExecute:
		return 2
	case resourceapi.DeviceTaintEffectNoSchedule:
		return 1
	}
	return 0
}

// applyBreaker asks the circuit breaker before any rule becomes more disruptive than it is now;
// a GPU the breaker holds back is tainted None instead (still visible everywhere). A GPU with
// several devices (MIG partitions, a VFIO device) is asked about once: the budget counts GPUs.
// Without a breaker, desired is left as it is.
func (s *Syncer) applyBreaker(ctx context.Context, desired map[string]*resourceapi.DeviceTaintRule, existing []*resourceapi.DeviceTaintRule) error {
	if s.opts.Breaker == nil {
		return nil
	}
	now := map[string]resourceapi.DeviceTaintEffect{}
	for _, r := range existing {
		now[ruleKey(r)] = r.Spec.Taint.Effect
	}
	type answer struct {
		ok  bool
		err error
	}
	asked := map[string]answer{}
	held := map[string]bool{}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(desired)) {
		want := desired[name]
		if disruption(want.Spec.Taint.Effect) == 0 || disruption(want.Spec.Taint.Effect) <= disruption(now[want.Name]) {
			continue
		}
		uuid := want.Labels[UUIDLabel]
		a, done := asked[uuid]
		if !done {
			a.ok, a.err = s.opts.Breaker.Admit(ctx, uuid)
			asked[uuid] = a
			if a.err != nil {
				errs = append(errs, fmt.Errorf("circuit breaker: %w", a.err))
			}
		}
		if a.ok {
			continue
		}
		// Held back: keep what the rule already has (the budget could not be asked) or None.
		want.Spec.Taint.Effect = now[want.Name]
		if want.Spec.Taint.Effect == "" {
			want.Spec.Taint.Effect = resourceapi.DeviceTaintEffectNone
		}
		if a.err == nil {
			held[uuid] = true
		}
	}
	heldList := slices.Sorted(maps.Keys(held))
	if s.opts.Breaker.SetHeld(heldList) && s.opts.HeldChanged != nil {
		s.opts.HeldChanged(heldList)
	}
	return errors.Join(errs...)
}
