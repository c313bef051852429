package agent

import (
	"context"
	"errors"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/evict"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/kube/podresources"
)

// newEvictor builds the evictor of the pods holding GPUs that ask for eviction
// (agent.eviction), or nothing when it is off. With the circuit breaker on it has a Breaker of
// its own (one more watch of the breaker's ConfigMap by name): slots are per node and GPU, so a
// GPU whose taint already took a slot is admitted by the same slot, and one that did not takes
// one. start must run before the evictor's Run.
func (w *wiring) newEvictor() (ev *evict.Evictor, start func(context.Context) error, err error) {
	opts, cfg := w.opts, w.cfg
	ec := cfg.Eviction.WithDefaults()
	if !ec.Enabled {
		return nil, nil, nil
	}
	evicter, ok := opts.Client.(kube.Evicter)
	if !ok {
		return nil, nil, errors.New("agent: eviction is enabled but the client cannot evict pods")
	}
	eo := evict.Options{
		NodeName: opts.NodeName, Client: opts.Client, Evicter: evicter,
		Finders: []evict.Finder{
			evict.PodResources{Lister: podresources.Socket{Path: ec.PodResourcesSocket}},
			evict.Volcano{Client: opts.Client, NodeName: opts.NodeName},
		},
		Recorder: w.recorder, NodeRef: w.nodeRef, Clock: opts.Clock, Self: selfPod(),
		DryRun: ec.DryRun, GracePeriod: time.Duration(*ec.GracePeriod), Retry: time.Duration(*ec.Retry),
		ExcludeNamespaces: ec.ExcludeNamespaces, ReportOnlyNamespaces: ec.ReportOnlyNamespaces, DaemonSetPods: ec.DaemonSetPods,
		Nodes: w.caches.nodes,
	}
	var cb *breaker.Breaker
	if cfg.CircuitBreaker.Enabled {
		cb = w.newBreaker()
		eo.Breaker = cb
	}
	ev, err = evict.New(eo)
	if err != nil {
		return nil, nil, err
	}
	start = func(ctx context.Context) error {
		if cb == nil {
			return nil
		}
		return cb.Start(ctx, ev.Trigger)
	}
	return ev, start, nil
}
