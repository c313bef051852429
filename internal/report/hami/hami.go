// Package hami reports Unhealthy GPUs to HAMi's scheduler through HAMi's per-GPU cordon: the Node
// annotation hami.io/device-cordon, a comma-separated list of GPU UUIDs that HAMi leaves out of
// new allocations without touching pods already running on them (HAMi's
// pkg/device/nvidia/device.go, cordonedDevices and Fit: entries are trimmed, empty ones skipped,
// each compared with the device ID, which is the GPU UUID). Volcano's vGPU path, which ignores
// volcano.sh/gpu-unhealthy-ids, reads the same devices through HAMi.
//
// Operators cordon GPUs by hand with the same annotation, so it is a shared list (gpuhealthv1.
// MergeCordon): gpuhealth adds the UUIDs of physical GPUs it finds Unhealthy (drained GPUs
// included), keeps every entry someone else put there, and removes only its own, bookkept in
// gpuhealth.dev/hami-device-cordon-state. A MIG instance's fault does not cordon its card (HAMi
// cordons whole cards); the card's own faults do. The reporter is opt-in
// (agent.reporters: [..., hami]).
package hami

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Syncer writes HAMi's cordon annotation of one Node.
type Syncer struct {
	nodeName string
	nodes    *nodecache.Cache
	writer   *report.AnnotationWriter

	bad report.LastValue // bad input already logged
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
	return &Syncer{nodeName: nodeName, nodes: nodes, writer: report.NewAnnotationWriter(client, nodes, gpuhealthv1.HAMiCordonKey, gpuhealthv1.HAMiStateKey)}
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "hami" }

// Start implements report.Starter: a change of the cordon by someone else is merged at once.
func (s *Syncer) Start(ctx context.Context, trigger func()) error {
	if err := s.writer.OnForeignChange(trigger); err != nil {
		return err
	}
	return s.nodes.Start(ctx)
}

// Cordoned returns the UUIDs of the physical GPUs gpuhealth cordons for snap, sorted.
func Cordoned(snap health.Snapshot) []string {
	var out []string
	// A missing GPU's UUID is a placeholder HAMi never registered: UnhealthyGPUs leaves it out.
	for _, d := range snap.UnhealthyGPUs() {
		out = append(out, d.Device.UUID)
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
	ours := Cordoned(snap)
	// The cordon is shared with operators: merged on the Node as it is when written.
	return s.writer.WriteMerged(ctx, node, func(node *corev1.Node) (map[string]string, error) {
		merged := gpuhealthv1.MergeCordon(node.Annotations, ours)
		s.logBadInput(ctx, merged)
		return map[string]string{gpuhealthv1.HAMiCordonKey: merged.Value, gpuhealthv1.HAMiStateKey: merged.State}, nil
	})
}

// logBadInput logs entries with blanks and an unreadable state once per distinct value.
func (s *Syncer) logBadInput(ctx context.Context, m gpuhealthv1.MergeResult) {
	bad := strings.Join(m.Invalid, ",")
	if m.Oversized > 0 {
		bad += fmt.Sprintf(" / %d entries, more than %d", m.Oversized, gpuhealthv1.MaxListEntries)
	}
	if m.StateErr != nil {
		bad += " / " + m.StateErr.Error()
	}
	if s.bad.Changed(bad) && bad != "" {
		klog.FromContext(ctx).Info("Keeping unexpected content of HAMi's cordon annotation as it is",
			"node", s.nodeName, "annotation", gpuhealthv1.HAMiCordonKey, "entries", m.Invalid, "stateErr", m.StateErr, "oversized", m.Oversized)
	}
}
