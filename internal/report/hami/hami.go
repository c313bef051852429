// Package hami reports Unhealthy GPUs to HAMi's scheduler through HAMi's per-GPU cordon: the Node
// annotation hami.io/device-cordon, a comma-separated list of GPU UUIDs that HAMi leaves out of
// new allocations without touching pods already running on them (HAMi's
// pkg/device/nvidia/device.go, cordonedDevices and Fit: entries are trimmed, empty ones skipped,
// each compared with the device ID, which is the GPU UUID). Volcano's vGPU path, which ignores
// volcano.sh/gpu-unhealthy-ids, reads the same devices through HAMi.
//
// Operators cordon GPUs by hand with the same annotation, so it is a shared list (package
// sharedlist): gpuhealth adds the UUIDs of physical GPUs it finds Unhealthy (drained GPUs
// included), keeps every entry someone else put there, and removes only its own, bookkept in
// gpuhealth.dev/hami-device-cordon-state. A MIG instance's fault does not cordon its card (HAMi
// cordons whole cards); the card's own faults do. The reporter is opt-in
// (agent.reporters: [..., hami]).
package hami

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/report/sharedlist"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Annotation keys.
const (
	// CordonKey is HAMi's per-GPU cordon (hami.io/device-cordon).
	CordonKey = "hami.io/device-cordon"
	// StateKey is gpuhealth's bookkeeping of its share of CordonKey.
	StateKey = "gpuhealth.dev/hami-device-cordon-state"
	// healthKey is the agent's own per-GPU summary (annotation.HealthKey), read at first start to
	// tell gpuhealth's earlier entries from others'.
	healthKey = "gpuhealth.dev/gpu-health"
)

// uuids is the cordon list's format: any non-empty entry is a device ID to HAMi; sorted.
var uuids = sharedlist.Format{
	Valid:   func(s string) bool { return !strings.ContainsAny(s, " \t") },
	Compare: strings.Compare,
}

// Syncer writes HAMi's cordon annotation of one Node.
type Syncer struct {
	client   kubernetes.Interface
	nodeName string
	nodes    *nodecache.Cache

	mu      sync.Mutex
	written map[string]string // the values of the last patch, to ignore its own informer event
	lastBad string            // bad input already logged
}

var (
	_ report.Syncer  = (*Syncer)(nil)
	_ report.Starter = (*Syncer)(nil)
)

// New returns a Syncer for nodeName reading the Node from nodes (the agent's shared cache).
func New(client kubernetes.Interface, nodeName string, nodes *nodecache.Cache) *Syncer {
	if nodes == nil {
		nodes = nodecache.New(client, nodeName)
	}
	return &Syncer{client: client, nodeName: nodeName, nodes: nodes}
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "hami" }

// Start implements report.Starter: a change of the cordon by someone else is merged at once.
func (s *Syncer) Start(ctx context.Context, trigger func()) error {
	if err := s.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if !ok1 || !ok2 {
				trigger()
				return
			}
			changed := o.Annotations[CordonKey] != n.Annotations[CordonKey] || o.Annotations[StateKey] != n.Annotations[StateKey]
			if changed && !s.isOurs(n) {
				trigger()
			}
		},
	}); err != nil {
		return err
	}
	return s.nodes.Start(ctx)
}

func (s *Syncer) isOurs(n *corev1.Node) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written != nil && n.Annotations[CordonKey] == s.written[CordonKey] && n.Annotations[StateKey] == s.written[StateKey]
}

// Cordoned returns the UUIDs of the physical GPUs gpuhealth cordons for snap, sorted.
func Cordoned(snap health.Snapshot) []string {
	var out []string
	for _, d := range snap.Devices {
		if d.Device.MIG == nil && d.Health == health.Unhealthy {
			out = append(out, d.Device.UUID)
		}
	}
	slices.Sort(out)
	return out
}

// Sync implements report.Syncer.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	node, err := s.nodes.Get(ctx)
	if err != nil {
		return 0, err
	}
	ann := node.Annotations
	merged := uuids.Merge(ann[CordonKey], ann[StateKey], slices.Sorted(maps.Keys(report.PreviouslyUnhealthy(ann[healthKey]))), Cordoned(snap))
	s.logBadInput(ctx, merged)
	want := map[string]string{CordonKey: merged.Value, StateKey: merged.State}
	patch := map[string]any{}
	for key, value := range want {
		current, present := ann[key]
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
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": patch}})
	if err != nil {
		return 0, err
	}
	patched, err := s.client.CoreV1().Nodes().Patch(ctx, s.nodeName, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "gpuhealth-agent"})
	if err != nil {
		return 0, fmt.Errorf("patch node %s annotation %s: %w", s.nodeName, CordonKey, err)
	}
	s.nodes.Wrote(patched)
	s.mu.Lock()
	s.written = want
	s.mu.Unlock()
	return 1, nil
}

// logBadInput logs entries with blanks and an unreadable state once per distinct value.
func (s *Syncer) logBadInput(ctx context.Context, m sharedlist.Result) {
	bad := strings.Join(m.Invalid, ",")
	if m.StateErr != nil {
		bad += " / " + m.StateErr.Error()
	}
	s.mu.Lock()
	fresh := bad != s.lastBad
	s.lastBad = bad
	s.mu.Unlock()
	if fresh && bad != "" {
		klog.FromContext(ctx).Info("Keeping unexpected content of HAMi's cordon annotation as it is",
			"node", s.nodeName, "annotation", CordonKey, "entries", m.Invalid, "stateErr", m.StateErr)
	}
}
