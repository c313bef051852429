package devicetaint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// write makes the node's rules what desired says, keeping the view in step: it updates the
// existing rules that differ, creates the missing ones and then deletes those no longer desired
// (in that order, so that a rule replaced by one under another name, as after an upgrade that
// renamed rules, never leaves its device untainted in between). It returns the writes made.
// Rules are matched by their key (ruleKey), not their name. desired is consumed.
func (s *Syncer) write(ctx context.Context, desired map[string]*resourceapi.DeviceTaintRule, existing []*resourceapi.DeviceTaintRule) (int, error) {
	var errs []error
	writes := 0
	var unwanted []*resourceapi.DeviceTaintRule
	for _, have := range existing {
		want, ok := desired[ruleKey(have)]
		if !ok {
			unwanted = append(unwanted, have) // also a second rule of the same key
			continue
		}
		delete(desired, ruleKey(have))
		n, err := s.update(ctx, have, want)
		writes += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	n, err := s.create(ctx, desired)
	writes += n
	errs = append(errs, err)
	rules := s.client.ResourceV1().DeviceTaintRules()
	for _, have := range unwanted {
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
	}
	return writes, errors.Join(errs...)
}

// create creates the missing rules, in name order; it returns the writes made. A name held by a
// rule of another node (which this node's agent may not change, and which another node's agent
// could have taken on purpose) is reported once through Options.NameTaken, and the rule is
// created under a name the API server makes unique instead, keeping its own name in
// KeyAnnotation.
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
			if holder := have.Labels[NodeLabel]; holder != s.nodeName {
				created, err = s.createUnderAnotherName(ctx, want, holder)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				s.view[created.Name] = created
				writes++
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

// createUnderAnotherName creates want with a name the API server generates from its own, because
// a rule labelled for holder (another node, or none) has that name.
func (s *Syncer) createUnderAnotherName(ctx context.Context, want *resourceapi.DeviceTaintRule, holder string) (*resourceapi.DeviceTaintRule, error) {
	key := want.Name
	if s.opts.NameTaken != nil && !s.taken[key] {
		s.opts.NameTaken(key, holder)
	}
	s.taken[key] = true
	klog.FromContext(ctx).Info("Warning: a DeviceTaintRule of another node holds this rule's name; creating it under another name",
		"rule", key, "holderNode", holder)
	other := want.DeepCopy()
	other.Name, other.GenerateName = "", key+"-"
	created, err := s.client.ResourceV1().DeviceTaintRules().Create(ctx, other, metav1.CreateOptions{FieldManager: "gpuhealth-agent"})
	if err != nil {
		return nil, fmt.Errorf("create DeviceTaintRule %s under another name (%s is held by a rule of node %q): %w", key, key, holder, err)
	}
	return created, nil
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
	if updated.Annotations == nil {
		updated.Annotations = map[string]string{}
	}
	updated.Annotations[KeyAnnotation] = want.Annotations[KeyAnnotation]
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

// same reports whether have already says what want says (the fields the syncer writes).
func same(have, want *resourceapi.DeviceTaintRule) bool {
	hs, ws := have.Spec.DeviceSelector, want.Spec.DeviceSelector
	return maps.Equal(have.Labels, want.Labels) && have.Annotations[KeyAnnotation] == want.Annotations[KeyAnnotation] &&
		len(have.OwnerReferences) == 1 && have.OwnerReferences[0].UID == want.OwnerReferences[0].UID &&
		hs != nil && eq(hs.Driver, ws.Driver) && eq(hs.Pool, ws.Pool) && eq(hs.Device, ws.Device) &&
		have.Spec.Taint.Key == want.Spec.Taint.Key && have.Spec.Taint.Value == want.Spec.Taint.Value &&
		have.Spec.Taint.Effect == want.Spec.Taint.Effect
}

func eq(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
