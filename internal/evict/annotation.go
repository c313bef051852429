package evict

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// publish writes the pending evictions to the Node's gpuhealth.dev/gpu-evictions annotation
// when they differ from what was last written (the first round always writes, clearing what a
// previous agent left). A failed write is tried again next round.
func (e *Evictor) publish(ctx context.Context, pending map[string]gpuhealthv1.GPUEvictions) error {
	value, err := gpuhealthv1.FormatEvictions(pending)
	if err != nil {
		return err
	}
	if e.published != nil && *e.published == value {
		return nil
	}
	var v any = value
	if value == "" {
		v = nil // a merge patch removes it
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{gpuhealthv1.EvictionsKey: v}}})
	if err != nil {
		return err
	}
	if _, err := e.opts.Client.CoreV1().Nodes().Patch(ctx, e.opts.NodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "gpuhealth-agent"}); err != nil {
		return fmt.Errorf("write %s on node %s: %w", gpuhealthv1.EvictionsKey, e.opts.NodeName, err)
	}
	e.published = &value
	return nil
}
