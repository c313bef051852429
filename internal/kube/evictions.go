package kube

import (
	"context"
	"encoding/json"
	"fmt"

	policyv1 "k8s.io/api/policy/v1"
)

// Evicter evicts pods through the Eviction API (POST pods/<name>/eviction), so that
// PodDisruptionBudgets are honoured: a budget that forbids it answers 429 Too Many Requests.
// It is an optional capability of an Interface, discovered by type assertion: the agent's
// eviction needs it, nothing else does.
type Evicter interface {
	Evict(ctx context.Context, eviction *policyv1.Eviction) error
}

var _ Evicter = (*Clientset)(nil)

// Evict implements Evicter. The body is JSON written here, so that policy/v1 stays out of the
// Scheme (the answer is a Status, which the Scheme has).
func (cs *Clientset) Evict(ctx context.Context, eviction *policyv1.Eviction) error {
	ev := *eviction
	ev.APIVersion, ev.Kind = policyv1.SchemeGroupVersion.String(), "Eviction"
	body, err := json.Marshal(&ev)
	if err != nil {
		return fmt.Errorf("encode eviction of pod %s/%s: %w", ev.Namespace, ev.Name, err)
	}
	return cs.core.Post().Namespace(ev.Namespace).Resource("pods").Name(ev.Name).SubResource("eviction").
		SetHeader("Content-Type", "application/json").Body(body).Do(ctx).Error()
}
