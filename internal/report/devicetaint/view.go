package devicetaint

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The syncer's view of its rules (see the Syncer's fields for why it does not watch them): listed
// at start, again every Options.Relist and after a write that found the view wrong, and kept in
// step with every write's response in between.

// existing returns this node's rules in name order, as the view has them; it lists them first
// when the view is stale or due for its periodic relist.
func (s *Syncer) existing(ctx context.Context) ([]*resourceapi.DeviceTaintRule, error) {
	if !s.fresh || s.opts.Clock.Since(s.listed) >= s.opts.Relist {
		if err := s.relist(ctx); err != nil {
			return nil, err
		}
	}
	return slices.SortedFunc(maps.Values(s.view), func(a, b *resourceapi.DeviceTaintRule) int { return strings.Compare(a.Name, b.Name) }), nil
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
