package agent

import (
	"context"
	"maps"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// drainWatcher follows the administrative drains on this agent's Node (the gpu-drains
// annotation written by `gpuhealth drain`) and hands the complete set to the monitor. The drains
// live in the cluster, so they survive agent restarts and node reboots, and only an undrain ends
// one. A malformed annotation is reported and the drains in force are kept: losing a drain
// because someone mistyped would put work back on a GPU an operator took away.
type drainWatcher struct {
	nodes    *nodecache.Cache
	monitor  *health.Monitor
	clock    clock.PassiveClock
	recorder record.EventRecorder
	nodeRef  *corev1.ObjectReference

	last map[string]string // the set last applied
}

// run follows the Node until ctx is done.
func (w *drainWatcher) run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("watcher", "drains")
	// Events arrive on one informer goroutine, so apply needs no lock.
	apply := func(node *corev1.Node) {
		drains, err := gpuhealthv1.ParseDrains(node.Annotations[gpuhealthv1.DrainsKey])
		if err != nil {
			logger.Error(err, "Ignoring a malformed drains annotation; keeping the drains in force")
			w.recorder.Eventf(w.nodeRef, corev1.EventTypeWarning, "MalformedDrains", "gpuhealth kept the drains in force: %v", err)
			return
		}
		set := make(map[string]string, len(drains))
		for uuid, d := range drains {
			set[uuid] = d.Message()
		}
		if w.last != nil && maps.Equal(set, w.last) {
			return
		}
		w.last = set
		if unknown := w.monitor.SetDrains(set, w.clock.Now()); len(unknown) > 0 {
			logger.Info("Drains name GPUs this node does not have", "uuids", unknown)
		}
		logger.Info("Drains applied", "drained", len(set))
	}
	if err := w.nodes.AddEventHandler(kube.Handlers(apply, nil)); err != nil {
		return err
	}
	if err := w.nodes.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
