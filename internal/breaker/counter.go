package breaker

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// Counter keeps the cluster's GPU count in the breaker's ConfigMap: the physical GPUs the agents
// report in their Nodes' gpu-health annotations (MIG instances are not counted twice). It watches
// the Nodes' metadata only, once for the whole cluster, and writes when the count changes. Run it
// in one place (`gpuhealth breaker controller` elects a leader among its replicas).
type Counter struct {
	Client    kube.Interface
	Metadata  metadata.Interface
	Namespace string
	Clock     clock.PassiveClock
	// Counted, when set, is called with every count written (for metrics).
	Counted func(gpus int)
}

var nodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// Run counts until ctx is done.
func (c *Counter) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("controller", "breaker-counter")
	clk := c.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	var informers kube.Informers
	inf := informers.Add(kube.NewInformer(c.Metadata, c.Metadata.Resource(nodesResource), &metav1.PartialObjectMetadata{}, nil))
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "breaker-counter"})
	defer queue.ShutDown()
	if _, err := inf.AddEventHandler(dradevices.OnAnyChange(func() { queue.Add("count") })); err != nil {
		return err
	}
	informers.Start(ctx)
	defer informers.Shutdown()
	if err := informers.WaitForCacheSync(ctx); err != nil {
		return fmt.Errorf("breaker counter: %w", err)
	}
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	queue.Add("count")
	last := -1
	for {
		key, quit := queue.Get()
		if quit {
			return nil
		}
		objs := inf.GetStore().List()
		var err error
		total := 0
		for _, obj := range objs {
			if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
				total += PhysicalGPUs(m.Annotations[gpuhealthv1.HealthKey])
			}
		}
		if total != last {
			err = updateConfigMap(ctx, c.Client, c.Namespace, "gpuhealth-breaker-counter", func(data map[string]string) bool {
				if data[ClusterGPUsKey] == strconv.Itoa(total) {
					return false
				}
				data[ClusterGPUsKey] = strconv.Itoa(total)
				data[CountedAtKey] = clk.Now().UTC().Format(time.RFC3339)
				return true
			})
			if err == nil {
				logger.Info("Cluster GPU count", "gpus", total, "nodes", len(objs))
				last = total
				if c.Counted != nil {
					c.Counted(total)
				}
			}
		}
		if err != nil {
			logger.Error(err, "Counting the cluster's GPUs failed; retrying")
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

// PhysicalGPUs counts the GPUs (not MIG instances) in a gpu-health annotation; a malformed or
// absent annotation counts none.
func PhysicalGPUs(healthJSON string) int {
	var s map[string]gpuhealthv1.GPUSummary
	if json.Unmarshal([]byte(healthJSON), &s) != nil {
		return 0
	}
	n := 0
	for _, g := range s {
		if g.ParentUUID == "" {
			n++
		}
	}
	return n
}
