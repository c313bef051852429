package evict

import (
	"context"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// The pending evictions are published on the Node's gpuhealth.dev/gpu-evictions annotation
// through the writer every writer of the Node's annotations shares (report.AnnotationWriter): a
// patch of that key alone, only when the Node says otherwise, and a round as soon as someone else
// changes or removes it.

// startPublishing has a change of the annotation by someone else ask for a round, and starts the
// cache of the Node the writer reads (shared: it starts once).
func (e *Evictor) startPublishing(ctx context.Context) error {
	if err := e.writer.OnForeignChange(e.Trigger); err != nil {
		return err
	}
	return e.nodes.Start(ctx)
}

// publish makes the Node's gpuhealth.dev/gpu-evictions annotation list the pending evictions
// when it lists anything else (what a previous agent left included). A failed write is tried
// again next round.
func (e *Evictor) publish(ctx context.Context, pending map[string]gpuhealthv1.GPUEvictions) error {
	value, err := gpuhealthv1.FormatEvictions(pending)
	if err != nil {
		return err
	}
	node, err := e.nodes.Get(ctx)
	if err != nil {
		return err
	}
	_, err = e.writer.Write(ctx, node, map[string]string{gpuhealthv1.EvictionsKey: value})
	return err
}
