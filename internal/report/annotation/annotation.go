// Package annotation reports GPU health on the Node's annotations:
//
//   - volcano.sh/gpu-unhealthy-ids: the indexes of Unhealthy GPUs, ascending, comma-separated,
//     no spaces ("0,3"), as Volcano's device plugin writes it and its scheduler reads it; removed
//     when every GPU is healthy and no other writer has an entry in it. The key has other writers
//     (Volcano's device plugin, operators): gpuhealth keeps their entries and removes only its own,
//     bookkept in gpuhealth.dev/volcano-unhealthy-ids-state (see VolcanoStateKey);
//   - gpuhealth.dev/gpu-health: a JSON object keyed by device UUID with index, model, health,
//     reasons and since (report.GPUSummary), for every GPU and MIG instance.
//
// Only these keys are ever written, with a JSON merge patch, so other annotations are never
// touched. The syncer reads the Node from the agent's shared cache (nodecache) and writes only
// when a value differs.
package annotation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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
	UnhealthyIDsKey = "volcano.sh/gpu-unhealthy-ids"
	HealthKey       = "gpuhealth.dev/gpu-health"
	// DrainsKey holds administrative per-GPU drains (written by `gpuhealth drain`, read by the
	// agent and the extender): a JSON object keyed by GPU UUID whose values are Drain.
	DrainsKey = "gpuhealth.dev/gpu-drains"
)

// Drain records who drained a GPU, when and why. A drained GPU is treated by every reporter as
// Unhealthy with reason AdminDrain, until `gpuhealth undrain`.
type Drain struct {
	Index  int       `json:"index"`
	Reason string    `json:"reason"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
}

// ParseDrains decodes the drains annotation. An empty value means no drains.
func ParseDrains(value string) (map[string]Drain, error) {
	drains := map[string]Drain{}
	if strings.TrimSpace(value) == "" {
		return drains, nil
	}
	if err := json.Unmarshal([]byte(value), &drains); err != nil {
		return nil, fmt.Errorf("%s: %w", DrainsKey, err)
	}
	for uuid := range drains {
		if uuid == "" {
			return nil, fmt.Errorf("%s: an entry has an empty UUID", DrainsKey)
		}
	}
	return drains, nil
}

// Message is how a drain reads in a condition message.
func (d Drain) Message() string {
	msg := "drained by " + d.By
	if !d.At.IsZero() {
		msg += " at " + d.At.UTC().Format(time.RFC3339)
	}
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	return msg
}

// Syncer writes the annotations of one Node.
type Syncer struct {
	client   kubernetes.Interface
	nodeName string
	nodes    *nodecache.Cache

	// written holds the values of the last successful patch, so that the informer event our own
	// patch causes does not cost another Sync.
	mu      sync.Mutex
	written map[string]string
	// lastGarbage and lastStateErr keep bad input from other writers to one log line per value.
	lastGarbage  string
	lastStateErr string
}

// syncedKeys are the annotations the syncer owns or shares.
var syncedKeys = []string{UnhealthyIDsKey, HealthKey, VolcanoStateKey}

var (
	_ report.Syncer  = (*Syncer)(nil)
	_ report.Starter = (*Syncer)(nil)
)

// New returns a Syncer for nodeName that reads the Node from nodes, the agent's shared cache; nil
// gives the syncer a cache of its own.
func New(client kubernetes.Interface, nodeName string, nodes *nodecache.Cache) *Syncer {
	if nodes == nil {
		nodes = nodecache.New(client, nodeName)
	}
	return &Syncer{client: client, nodeName: nodeName, nodes: nodes}
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "annotation" }

// Start watches the Node so that a change by someone else (an annotation removed by hand) is
// repaired at once rather than at the next resync.
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
			changed := slices.ContainsFunc(syncedKeys, func(k string) bool { return o.Annotations[k] != n.Annotations[k] })
			if changed && !s.isOurs(n) {
				trigger()
			}
		},
	}); err != nil {
		return err
	}
	return s.nodes.Start(ctx)
}

// isOurs reports whether the node's annotations are exactly what the last patch wrote.
func (s *Syncer) isOurs(n *corev1.Node) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written == nil {
		return false
	}
	for _, key := range syncedKeys {
		if n.Annotations[key] != s.written[key] {
			return false
		}
	}
	return true
}

// Desired returns the two annotation values for snap; "" means the annotation must be absent.
func Desired(snap health.Snapshot) (unhealthyIDs, healthJSON string, err error) {
	idx := report.UnhealthyIndexes(snap)
	parts := make([]string, len(idx))
	for i, v := range idx {
		parts[i] = strconv.Itoa(v)
	}
	summary := make(map[string]report.GPUSummary, len(snap.Devices))
	for _, d := range snap.Devices {
		summary[d.Device.UUID] = report.Summarize(d)
	}
	b, err := json.Marshal(summary) // map keys are sorted: the value is deterministic
	if err != nil {
		return "", "", err
	}
	return strings.Join(parts, ","), string(b), nil
}

// Sync implements report.Syncer.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	_, healthJSON, err := Desired(snap)
	if err != nil {
		return 0, err
	}
	node, err := s.nodes.Get(ctx)
	if err != nil {
		return 0, err
	}
	merged := mergeVolcanoIDs(node.Annotations, report.UnhealthyIndexes(snap))
	s.logBadInput(ctx, merged)
	patch := map[string]any{}
	want := map[string]string{UnhealthyIDsKey: merged.Value, HealthKey: healthJSON, VolcanoStateKey: merged.State}
	for key, value := range want {
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
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": patch}})
	if err != nil {
		return 0, err
	}
	patched, err := s.client.CoreV1().Nodes().Patch(ctx, s.nodeName, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "gpuhealth-agent"})
	if err != nil {
		return 0, fmt.Errorf("patch node %s annotations: %w", s.nodeName, err)
	}
	s.nodes.Wrote(patched)
	s.mu.Lock()
	s.written = want
	s.mu.Unlock()
	return 1, nil
}

// logBadInput reports entries of another writer that are not GPU indexes, and an unreadable state,
// once per distinct value: they are kept, not repaired, so they would otherwise log on every sync.
func (s *Syncer) logBadInput(ctx context.Context, m sharedlist.Result) {
	logger := klog.FromContext(ctx)
	garbage := strings.Join(m.Invalid, ",")
	stateErr := ""
	if m.StateErr != nil {
		stateErr = m.StateErr.Error()
	}
	s.mu.Lock()
	newGarbage, newStateErr := garbage != s.lastGarbage, stateErr != s.lastStateErr
	s.lastGarbage, s.lastStateErr = garbage, stateErr
	s.mu.Unlock()
	if newGarbage && garbage != "" {
		logger.Info("Another writer put entries that are not GPU indexes in the Volcano annotation; keeping them as they are",
			"node", s.nodeName, "annotation", UnhealthyIDsKey, "entries", garbage)
	}
	if newStateErr && stateErr != "" {
		logger.Info("Ignoring an unreadable state annotation", "node", s.nodeName, "annotation", VolcanoStateKey, "err", stateErr)
	}
}
