// Package annotation reports GPU health on the Node's annotations:
//
//   - volcano.sh/gpu-unhealthy-ids: the indexes of Unhealthy GPUs, ascending, comma-separated,
//     no spaces ("0,3"), as Volcano's device plugin writes it and its scheduler reads it; removed
//     when every GPU is healthy and no other writer has an entry in it. The key has other writers
//     (Volcano's device plugin, operators): gpuhealth keeps their entries and removes only its own,
//     bookkept in gpuhealth.dev/volcano-unhealthy-ids-state (see gpuhealthv1.VolcanoStateKey);
//   - gpuhealth.dev/gpu-health: a JSON object keyed by device UUID with index, model, health,
//     reasons and since (gpuhealthv1.GPUSummary), for every GPU and MIG instance.
//
// The agent's heartbeat is not here: it renews a Lease (internal/heartbeat), so that nothing
// writes the Node while nothing changes.
//
// Only these keys are ever written, with a JSON merge patch, so other annotations are never
// touched. The syncer reads the Node from the agent's shared cache (nodecache) and writes only
// when a value differs.
package annotation

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Syncer writes the annotations of one Node.
type Syncer struct {
	nodeName string
	nodes    *nodecache.Cache
	writer   *report.AnnotationWriter

	// garbage and stateErr keep bad input from other writers to one log line per value.
	garbage, stateErr report.LastValue
}

var (
	_ report.Syncer  = (*Syncer)(nil)
	_ report.Starter = (*Syncer)(nil)
)

// Options configure a Syncer. The zero value is ready to use.
type Options struct {
	// Nodes, when set, is the agent's shared cache of this Node; nil gives the syncer one of its
	// own.
	Nodes *nodecache.Cache
}

// New returns a Syncer for nodeName.
func New(client kube.Interface, nodeName string, opts Options) *Syncer {
	nodes := opts.Nodes
	if nodes == nil {
		nodes = nodecache.New(client, nodeName)
	}
	keys := []string{gpuhealthv1.UnhealthyIDsKey, gpuhealthv1.HealthKey, gpuhealthv1.VolcanoStateKey}
	return &Syncer{nodeName: nodeName, nodes: nodes, writer: report.NewAnnotationWriter(client, nodes, keys...)}
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "annotation" }

// Start watches the Node so that a change by someone else (an annotation removed by hand,
// Volcano's device plugin rewriting its list) is merged at once rather than at the next resync.
func (s *Syncer) Start(ctx context.Context, trigger func()) error {
	if err := s.writer.OnForeignChange(trigger); err != nil {
		return err
	}
	return s.nodes.Start(ctx)
}

// Desired returns the two annotation values for snap on a Node no other writer touched; ""
// means the annotation must be absent.
func Desired(snap health.Snapshot) (unhealthyIDs, healthJSON string, err error) {
	want, _, err := gpuhealthv1.AgentAnnotations(snap, nil)
	return want[gpuhealthv1.UnhealthyIDsKey], want[gpuhealthv1.HealthKey], err
}

// Sync implements report.Syncer.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	node, err := s.nodes.Get(ctx)
	if err != nil {
		return 0, err
	}
	// The list is shared with Volcano's device plugin: merged on the Node as it is when written.
	return s.writer.WriteMerged(ctx, node, func(node *corev1.Node) (map[string]string, error) {
		want, merged, err := gpuhealthv1.AgentAnnotations(snap, node.Annotations)
		if err == nil {
			s.logBadInput(ctx, merged)
		}
		return want, err
	})
}

// logBadInput reports entries of another writer that are not GPU indexes, and an unreadable state,
// once per distinct value: they are kept, not repaired, so they would otherwise log on every sync.
func (s *Syncer) logBadInput(ctx context.Context, m gpuhealthv1.MergeResult) {
	logger := klog.FromContext(ctx)
	garbage := strings.Join(m.Invalid, ",")
	if m.Oversized > 0 {
		garbage = fmt.Sprintf("%d entries, more than %d", m.Oversized, gpuhealthv1.MaxListEntries) + ";" + garbage
	}
	stateErr := ""
	if m.StateErr != nil {
		stateErr = m.StateErr.Error()
	}
	newGarbage, newStateErr := s.garbage.Changed(garbage), s.stateErr.Changed(stateErr)
	if newGarbage && m.Oversized > 0 {
		logger.Info("Warning: the Volcano annotation has far more entries than any node has GPUs; merging it whole, as another writer's",
			"node", s.nodeName, "annotation", gpuhealthv1.UnhealthyIDsKey, "entries", m.Oversized, "limit", gpuhealthv1.MaxListEntries)
	}
	if newGarbage && len(m.Invalid) > 0 {
		logger.Info("Another writer put entries that are not GPU indexes in the Volcano annotation; keeping them as they are",
			"node", s.nodeName, "annotation", gpuhealthv1.UnhealthyIDsKey, "entries", garbage)
	}
	if newStateErr && stateErr != "" {
		logger.Info("Ignoring an unreadable state annotation", "node", s.nodeName, "annotation", gpuhealthv1.VolcanoStateKey, "err", stateErr)
	}
}
