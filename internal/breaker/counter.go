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
	warned := map[string]bool{} // nodes whose inflated count was logged
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
				n, claimed := physicalGPUs(m.Annotations[gpuhealthv1.HealthKey])
				if claimed > n && !warned[m.Name] {
					logger.Info("Warning: a node's annotation claims more GPUs than any node has; counting it for the most", "node", m.Name,
						"claimed", claimed, "counted", n)
					warned[m.Name] = true
				}
				total += n
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

// MaxGPUsPerNode is the most GPUs one node's annotation counts for: more than any server holds
// (a scenario's 64 included). The count is the breaker's budget, and the annotation is the node's
// own word: without a cap one 256 KiB annotation counted 6,121 GPUs and raised a 1,000-GPU
// cluster's budget sevenfold.
const MaxGPUsPerNode = 64

// PhysicalGPUs counts the GPUs (not MIG instances) in a gpu-health annotation, at most
// MaxGPUsPerNode; a malformed or absent annotation counts none.
func PhysicalGPUs(healthJSON string) int {
	n, _ := physicalGPUs(healthJSON)
	return n
}

// physicalGPUs is PhysicalGPUs and the uncapped count, for the warning.
func physicalGPUs(healthJSON string) (capped, claimed int) {
	var s map[string]gpuhealthv1.GPUSummary
	if json.Unmarshal([]byte(healthJSON), &s) != nil {
		return 0, 0
	}
	n := 0
	for _, g := range s {
		if g.ParentUUID == "" {
			n++
		}
	}
	return min(n, MaxGPUsPerNode), n
}
