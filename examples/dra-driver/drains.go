package main

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// drainSink is what watchDrains needs of health.Monitor.
type drainSink interface {
	SetDrains(drained map[string]string, now time.Time) []string
}

// watchDrains follows the administrative drains on the driver's Node (`gpuhealth drain NODE
// GPU` writes them into the annotation pkg/api/v1 defines) and hands the complete set to the
// health library, which makes a drained GPU Unhealthy until it is undrained: the driver then
// taints it and reports it like a fault. A malformed annotation is logged and the drains in
// force are kept, as the agent does. It returns when ctx ends.
func watchDrains(ctx context.Context, client kubernetes.Interface, node string, sink drainSink) error {
	logger := klog.FromContext(ctx).WithValues("watcher", "drains")
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, node).String()
	}))
	var last map[string]string // the set last applied; events arrive on one goroutine
	apply := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		drains, err := gpuhealthv1.ParseDrains(n.Annotations[gpuhealthv1.DrainsKey])
		if err != nil {
			logger.Error(err, "Ignoring a malformed drains annotation; keeping the drains in force")
			return
		}
		set := make(map[string]string, len(drains))
		for uuid, d := range drains {
			set[uuid] = d.Message()
		}
		if last != nil && maps.Equal(set, last) {
			return // a Node update that changed something else
		}
		last = set
		if unknown := sink.SetDrains(set, time.Now()); len(unknown) > 0 {
			logger.Info("Drains name GPUs this node does not have", "uuids", unknown)
		}
		logger.Info("Drains applied", "drained", len(set))
	}
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    apply,
		UpdateFunc: func(_, obj any) { apply(obj) },
	}); err != nil {
		return fmt.Errorf("watch node %s: %w", node, err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown() // waits for the informer's goroutines
	<-ctx.Done()
	return nil
}

var _ drainSink = (*health.Monitor)(nil)
