package report

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// AnnotationWriter writes a fixed set of the Node's annotations for one of the agent's writers (a
// reporter, remediation's states, the evictor's pending evictions): it patches only those keys (a
// JSON merge patch, so other annotations are never touched), only when a value differs, and tells
// its own writes apart from other writers' so that the informer event its own patch causes does
// not cost another sync.
type AnnotationWriter struct {
	nodes  *nodecache.Cache
	client kube.Interface
	keys   []string

	mu      sync.Mutex
	written map[string]string // the values of the last successful patch

	conflicts atomic.Uint64
}

// NewAnnotationWriter returns a writer of keys on the Node that nodes follows: every write it
// makes is recorded in nodes, and a Node it must read again (after a conflict) is read through it.
func NewAnnotationWriter(client kube.Interface, nodes *nodecache.Cache, keys ...string) *AnnotationWriter {
	return &AnnotationWriter{nodes: nodes, client: client, keys: keys}
}

// OnForeignChange calls trigger whenever one of the writer's keys changes on the Node to values
// this writer did not write (someone removed or replaced them), and when the Node appears.
func (w *AnnotationWriter) OnForeignChange(trigger func()) error {
	return w.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() },
		UpdateFunc: OnNodeUpdate(trigger, func(o, n *corev1.Node) bool {
			changed := slices.ContainsFunc(w.keys, func(k string) bool { return o.Annotations[k] != n.Annotations[k] })
			return changed && !w.isOurs(n)
		}),
	})
}

// OnNodeUpdate returns an informer's update handler that calls trigger when foreign says the
// change from the old Node to the new one is someone else's (what a writer of the Node must
// repair), and when the objects are not Nodes.
func OnNodeUpdate(trigger func(), foreign func(old, cur *corev1.Node) bool) func(oldObj, newObj any) {
	return func(oldObj, newObj any) {
		o, ok1 := oldObj.(*corev1.Node)
		n, ok2 := newObj.(*corev1.Node)
		if !ok1 || !ok2 || foreign(o, n) {
			trigger()
		}
	}
}

func (w *AnnotationWriter) isOurs(n *corev1.Node) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.written == nil {
		return false
	}
	return !slices.ContainsFunc(w.keys, func(k string) bool { return n.Annotations[k] != w.written[k] })
}

// Write makes the Node's annotations match want (key → value, "" = absent) for the writer's keys,
// given the Node as last read, with at most one patch. It returns the number of writes (0 or 1).
// Use it for keys only gpuhealth writes; for a key other writers share, WriteMerged.
func (w *AnnotationWriter) Write(ctx context.Context, node *corev1.Node, want map[string]string) (int, error) {
	return w.patch(ctx, node, want, "")
}

// WriteMerged writes what merge computes from the Node for the writer's keys, conditional on the
// Node not having changed since it was read: the patch carries the Node's resourceVersion, so a
// write by anyone else in between (Volcano's device plugin rewriting its list) makes the API
// server refuse it with Conflict instead of losing that write. Then the Node is read again and
// merge runs on it, up to retry.DefaultRetry's steps. An error of merge ends it, nothing written.
// It returns the number of writes.
func (w *AnnotationWriter) WriteMerged(ctx context.Context, node *corev1.Node, merge func(*corev1.Node) (map[string]string, error)) (int, error) {
	writes := 0
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		want, err := merge(node)
		if err != nil {
			return err
		}
		n, err := w.patch(ctx, node, want, node.ResourceVersion)
		writes += n
		if !apierrors.IsConflict(err) {
			return err
		}
		w.conflicts.Add(1)
		fresh, gerr := w.nodes.Refresh(ctx)
		if gerr != nil {
			return gerr
		}
		node = fresh
		return err
	})
	return writes, err
}

// Conflicts is the number of conditional writes the API server refused because the Node had
// changed since it was read (each was merged again).
func (w *AnnotationWriter) Conflicts() uint64 { return w.conflicts.Load() }

// patch patches the keys whose values differ from node's; a non-empty resourceVersion makes the
// patch conditional on it.
func (w *AnnotationWriter) patch(ctx context.Context, node *corev1.Node, want map[string]string, resourceVersion string) (int, error) {
	patch := map[string]any{}
	for _, key := range w.keys {
		value := want[key]
		current, present := node.Annotations[key]
		switch {
		case value == "" && present:
			patch[key] = nil
		case value != "" && current != value:
			patch[key] = value
		}
	}
	if len(patch) == 0 {
		return 0, nil
	}
	meta := map[string]any{"annotations": patch}
	if resourceVersion != "" {
		meta["resourceVersion"] = resourceVersion
	}
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return 0, err
	}
	patched, err := w.client.CoreV1().Nodes().Patch(ctx, w.nodes.NodeName(), types.MergePatchType, body, metav1.PatchOptions{FieldManager: "gpuhealth-agent"})
	if err != nil {
		return 0, fmt.Errorf("patch node %s annotations %v: %w", w.nodes.NodeName(), w.keys, err)
	}
	w.nodes.Wrote(patched)
	w.mu.Lock()
	w.written = want
	w.mu.Unlock()
	return 1, nil
}
