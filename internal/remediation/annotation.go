package remediation

import (
	"context"
	"encoding/json"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// AnnotationSyncer publishes the repair states in the Node annotation
// gpuhealth.dev/gpu-remediation, for `gpuhealth status` and operators.
type AnnotationSyncer struct {
	nodes       *nodecache.Cache
	writer      *report.AnnotationWriter
	states      func() map[string]State
	maxAttempts int
}

var (
	_ report.Syncer  = (*AnnotationSyncer)(nil)
	_ report.Starter = (*AnnotationSyncer)(nil)
)

// NewAnnotationSyncer returns the syncer of the node in nodes; states gives the repair states.
func NewAnnotationSyncer(client kube.Interface, nodes *nodecache.Cache, states func() map[string]State, maxAttempts int) *AnnotationSyncer {
	return &AnnotationSyncer{nodes: nodes, writer: report.NewAnnotationWriter(client, nodes, gpuhealthv1.RemediationKey), states: states, maxAttempts: maxAttempts}
}

// Name implements report.Syncer.
func (s *AnnotationSyncer) Name() string { return "remediation" }

// Start implements report.Starter.
func (s *AnnotationSyncer) Start(ctx context.Context, trigger func()) error {
	if err := s.writer.OnForeignChange(trigger); err != nil {
		return err
	}
	return s.nodes.Start(ctx)
}

// AnnotationValue is the annotation's value for states ("" when there is none).
func AnnotationValue(states map[string]State, maxAttempts int) (string, error) {
	if len(states) == 0 {
		return "", nil
	}
	out := make(map[string]gpuhealthv1.GPURemediation, len(states))
	for uuid, st := range states {
		out[uuid] = gpuhealthv1.GPURemediation{Phase: string(st.Phase), Since: st.Since.UTC(), Attempts: len(st.Attempts),
			MaxAttempts: maxAttempts, Fault: st.Fault, Message: st.Message}
	}
	b, err := json.Marshal(out) // sorted keys: deterministic
	return string(b), err
}

// Sync implements report.Syncer; the snapshot does not matter, the states do.
func (s *AnnotationSyncer) Sync(ctx context.Context, _ health.Snapshot) (int, error) {
	value, err := AnnotationValue(s.states(), s.maxAttempts)
	if err != nil {
		return 0, err
	}
	node, err := s.nodes.Get(ctx)
	if err != nil {
		return 0, err
	}
	return s.writer.Write(ctx, node, map[string]string{gpuhealthv1.RemediationKey: value})
}
