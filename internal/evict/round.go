package evict

import (
	"context"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// A round: every GPU that asks for eviction looked at once (decide.go decides for its pods),
// then what the Evictor keeps trimmed and the pending evictions published.

// target is one GPU (with its MIG instances) or a MIG instance alone that asks for eviction.
type target struct {
	gpu  health.Device
	migs []health.Device
}

func targets(snap health.Snapshot) []target {
	evicting := map[string]bool{}
	for _, d := range snap.Devices {
		if d.Device.MIG == nil && d.Evict {
			evicting[d.Device.UUID] = true
		}
	}
	var out []target
	for _, d := range snap.Devices {
		switch {
		case !d.Evict:
		case d.Device.MIG == nil:
			t := target{gpu: d.Device}
			for _, m := range snap.Devices {
				if m.Device.MIG != nil && m.Device.MIG.ParentUUID == d.Device.UUID {
					t.migs = append(t.migs, m.Device)
				}
			}
			out = append(out, t)
		case !evicting[d.Device.MIG.ParentUUID]:
			out = append(out, target{gpu: d.Device})
		}
	}
	return out
}

// Round looks once at every GPU that asks for eviction.
func (e *Evictor) Round(ctx context.Context) {
	e.mu.Lock()
	snap := e.snap
	e.mu.Unlock()
	now := e.opts.Clock.Now()
	pending := map[string]gpuhealthv1.GPUEvictions{}
	seen := map[string]bool{}
	held := map[types.UID]bool{}
	known := true
	for _, t := range targets(snap) {
		uuid := t.gpu.UUID
		seen[uuid] = true
		if _, ok := e.since[uuid]; !ok {
			e.since[uuid] = now
		}
		p, ok := e.gpu(ctx, t, now, held)
		known = known && ok
		if len(p) > 0 {
			pending[uuid] = gpuhealthv1.GPUEvictions{Index: t.gpu.Index, Pods: p}
		}
	}
	for uuid := range e.since {
		if !seen[uuid] {
			delete(e.since, uuid) // it no longer asks: a later fault starts a new grace period
		}
	}
	if known {
		e.forget(held)
	}
	e.mu.Lock()
	changed := !equalPending(e.pending, pending)
	e.pending = pending
	e.mu.Unlock()
	if err := e.publish(ctx, pending); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot publish the pending evictions; retrying")
	}
	if changed && e.opts.Changed != nil {
		e.opts.Changed()
	}
}

// forget drops what the Evictor keeps of the pods that no GPU asking for eviction holds (their
// backoff, their Events already recorded): when a GPU asks again later, its pods are a new case,
// and what a long-running agent keeps stays bounded by the pods it is evicting.
func (e *Evictor) forget(held map[types.UID]bool) {
	for uid := range e.pods {
		if !held[uid] {
			delete(e.pods, uid)
		}
	}
	for key := range e.noticed {
		if uid, _, _ := strings.Cut(key, "/"); uid != "node" && !held[types.UID(uid)] {
			delete(e.noticed, key)
		}
	}
}

func equalPending(a, b map[string]gpuhealthv1.GPUEvictions) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Index != w.Index || !slices.Equal(v.Pods, w.Pods) {
			return false
		}
	}
	return true
}
