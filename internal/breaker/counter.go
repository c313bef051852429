package breaker

import (
	"cmp"
	"context"
	"maps"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/heartbeat"
	"github.com/gpuhealth/gpuhealth/pkg/dra"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// Counter keeps the cluster's GPU count in the breaker's ConfigMap: the physical GPUs the agents
// report in their Nodes' gpu-health annotations (MIG instances are not counted twice), each node
// capped at what others than its agent say it has: its ResourceSlices of Driver (the DRA driver's
// GPUs, by PCI address) or its capacity of CapacityResources (the device plugins'), whichever is
// larger, and never more than MaxGPUsPerNode. An agent writes its own annotation, so without the
// cap one node could raise the breaker's budget for the whole cluster. It watches the Nodes and
// the driver's ResourceSlices once for the whole cluster, keeping only what it counts, and writes
// when the count changes. Run it in one place (`gpuhealth breaker controller` elects a leader
// among its replicas).
type Counter struct {
	Client    kube.Interface
	Namespace string
	// Driver is the DRA driver whose ResourceSlices bound a node's count (default gpu.nvidia.com).
	Driver string
	// CapacityResources are the extended resources whose capacity bounds a node's count (default
	// DefaultCapacityResources); a name ending in "*" is a prefix.
	CapacityResources []string
	// StaleAfter: a node whose agent's heartbeat (its Lease in Namespace, or an earlier release's
	// annotation) is older (or unreadable) counts for no GPUs:
	// its report means nothing, and its GPUs can be neither admitted nor held. 0 counts every
	// node. Nodes without a heartbeat count as before.
	StaleAfter time.Duration
	Clock      clock.PassiveClock
	// Stale, when set, is called with the stale nodes of every count (for metrics).
	Stale func(nodes int)
	// Counted, when set, is called with every count written (for metrics).
	Counted func(gpus int)
	// Domains: each value of each label gets its GPUs counted too (DomainGPUsKey), at most
	// MaxDomainValues values in all.
	Domains []Domain
}

// DefaultCapacityResources are what GPU device plugins advertise: NVIDIA's whole GPUs and MIG
// devices (HAMi's too), and Volcano's GPU shares. Shares and MIG devices outnumber GPUs, so they
// can only loosen the cap, never count a node short.
var DefaultCapacityResources = []string{"nvidia.com/gpu", "nvidia.com/mig-*", "volcano.sh/vgpu-number"}

// Run counts until ctx is done.
func (c *Counter) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("controller", "breaker-counter")
	clk := c.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	driver := cmp.Or(c.Driver, "gpu.nvidia.com")
	resources := c.CapacityResources
	if resources == nil {
		resources = DefaultCapacityResources
	}
	var informers kube.Informers
	nodes := informers.Add(kube.NewInformer(c.Client, c.Client.CoreV1().Nodes(), &corev1.Node{}, nil))
	slices := informers.Add(kube.NewInformer(c.Client, c.Client.ResourceV1().ResourceSlices(), &resourceapi.ResourceSlice{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.driver", driver).String()
	}))
	// Keep only what is counted: a Node's gpu-health annotation and its GPU capacities.
	domainLabels := make([]string, 0, len(c.Domains))
	for _, d := range c.Domains {
		domainLabels = append(domainLabels, d.Label)
	}
	if err := nodes.SetTransform(func(obj any) (any, error) { return countedNode(obj, resources, domainLabels...), nil }); err != nil {
		return err
	}
	// The agents' heartbeats, on Leases in the breaker's namespace (the chart's).
	leases := heartbeat.NewLeases(c.Client, c.Namespace)
	informers.Add(leases.Informer())
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "breaker-counter"})
	defer queue.ShutDown()
	// Nodes change far more often than slices (every agent's heartbeat): the slices' GPUs are
	// counted again only after a slice event.
	var slicesChanged atomic.Bool
	slicesChanged.Store(true)
	if _, err := nodes.AddEventHandler(dradevices.OnAnyChange(func() { queue.Add("count") })); err != nil {
		return err
	}
	if _, err := slices.AddEventHandler(dradevices.OnAnyChange(func() { slicesChanged.Store(true); queue.Add("count") })); err != nil {
		return err
	}
	if _, err := leases.Informer().AddEventHandler(dradevices.OnAnyChange(func() { queue.Add("count") })); err != nil {
		return err
	}
	queue.Add("count")
	st := &counting{logger: logger, clk: clk, resources: resources, last: -1, warned: map[string]bool{}, leases: leases, domainLabels: domainLabels}
	return kube.Work(ctx, "breaker counter", &informers, queue, func(key string) {
		if slicesChanged.Swap(false) {
			st.sliceGPUs = gpusInSlices(slices.GetStore().List(), driver)
		}
		if err := c.count(ctx, st, nodes.GetStore().List()); err != nil {
			logger.Error(err, "Counting the cluster's GPUs failed; retrying")
			queue.AddRateLimited(key)
			return
		}
		queue.Forget(key)
		if c.StaleAfter > 0 {
			// A node goes stale by its silence, which no event announces: count again.
			queue.AddAfter(key, min(time.Minute, c.StaleAfter/3))
		}
	})
}

// counting is what one Run counts by, and what it keeps from one count to the next.
type counting struct {
	logger    klog.Logger
	clk       clock.PassiveClock
	resources []string
	// last is the count last written (-1: none yet); sliceGPUs the GPUs each node's
	// ResourceSlices publish, counted again after a slice event.
	last      int
	sliceGPUs map[string]int
	warned    map[string]bool // nodes whose inflated count was logged
	leases    *heartbeat.Leases
	// domainLabels are the Counter's domains' labels; lastDomains the domain data last written.
	domainLabels []string
	lastDomains  map[string]string
}

// count counts the GPUs of the nodes (objs) and writes the count when it changed.
func (c *Counter) count(ctx context.Context, st *counting, objs []any) error {
	total, stale := 0, 0
	var domains domainCount
	now := st.clk.Now()
	for _, obj := range objs {
		n, ok := obj.(*corev1.Node)
		if !ok {
			continue
		}
		if st.leases.Judge(n.Name, n.Annotations, now, c.StaleAfter).Stale {
			stale++
			continue
		}
		gpus := st.node(n)
		total += gpus
		domains.add(st.domainLabels, n.Labels, gpus)
	}
	if c.Stale != nil {
		c.Stale(stale)
	}
	var domainData map[string]string // nil: no domains, their keys are removed
	dropped := 0
	if len(st.domainLabels) > 0 {
		var counted DomainGPUs
		counted, dropped = domains.capped(st.domainLabels, MaxDomainValues)
		domainData = encodeDomains(counted, c.Domains, dropped)
	}
	if total == st.last && maps.Equal(domainData, st.lastDomains) {
		return nil
	}
	err := updateConfigMap(ctx, c.Client, c.Namespace, "gpuhealth-breaker-counter", func(data map[string]string) bool {
		changed := setDomainData(data, domainData)
		if data[ClusterGPUsKey] == strconv.Itoa(total) && !changed {
			return false
		}
		data[ClusterGPUsKey] = strconv.Itoa(total)
		data[CountedAtKey] = st.clk.Now().UTC().Format(time.RFC3339)
		return true
	})
	if err != nil {
		return err
	}
	st.logger.Info("Cluster GPU count", "gpus", total, "nodes", len(objs))
	if dropped > 0 && st.lastDomains[DomainValuesDroppedKey] != domainData[DomainValuesDroppedKey] {
		st.logger.Info("Warning: more domain values than the breaker counts; the nodes of the values left out are under the cluster's budget only",
			"counted", MaxDomainValues, "leftOut", dropped)
	}
	st.last, st.lastDomains = total, domainData
	if c.Counted != nil {
		c.Counted(total)
	}
	return nil
}

// node is what node n counts for: the GPUs its annotation claims, capped at what its
// ResourceSlices and capacity say it has and at MaxGPUsPerNode.
func (st *counting) node(n *corev1.Node) int {
	claimed := physicalGPUs(n.Annotations[gpuhealthv1.HealthKey])
	bound := max(st.sliceGPUs[n.Name], capacityGPUs(n, st.resources))
	if bound == 0 {
		bound = MaxGPUsPerNode // nothing else describes the node's GPUs: only the hard cap
	}
	counted := min(claimed, bound, MaxGPUsPerNode)
	if claimed > counted && !st.warned[n.Name] {
		st.logger.Info("Warning: a node's annotation claims more GPUs than its ResourceSlices and capacity say it has; counting it for what they say", "node", n.Name,
			"claimed", claimed, "counted", counted, "resourceSliceGPUs", st.sliceGPUs[n.Name], "capacityGPUs", capacityGPUs(n, st.resources))
		st.warned[n.Name] = true
	}
	return counted
}

// countedNode is a Node reduced to what the Counter reads: its name, gpu-health annotation,
// the capacities of resources and the labels of its domains.
func countedNode(obj any, resources []string, labels ...string) any {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj // a tombstone
	}
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: n.Namespace, ResourceVersion: n.ResourceVersion, UID: n.UID}}
	for _, l := range labels {
		if v, ok := n.Labels[l]; ok {
			if out.Labels == nil {
				out.Labels = map[string]string{}
			}
			out.Labels[l] = v
		}
	}
	for _, k := range []string{gpuhealthv1.HealthKey, gpuhealthv1.HeartbeatKey} {
		if v, ok := n.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	for name, q := range n.Status.Capacity {
		if matchesResource(string(name), resources) {
			if out.Status.Capacity == nil {
				out.Status.Capacity = corev1.ResourceList{}
			}
			out.Status.Capacity[name] = q
		}
	}
	return out
}

func matchesResource(name string, resources []string) bool {
	for _, r := range resources {
		if p, ok := strings.CutSuffix(r, "*"); ok && strings.HasPrefix(name, p) || name == r {
			return true
		}
	}
	return false
}

// capacityGPUs is the node's capacity of the GPU resources: an upper bound of its GPUs.
func capacityGPUs(n *corev1.Node, resources []string) int {
	total := int64(0)
	for name, q := range n.Status.Capacity {
		if matchesResource(string(name), resources) {
			total += max(q.Value(), 0)
		}
	}
	return int(min(total, math.MaxInt32))
}

// gpusInSlices counts the physical GPUs each node's ResourceSlices of driver publish: the
// distinct PCI addresses (a GPU's MIG partitions and VFIO device share it), and the distinct
// UUIDs of devices with neither an address nor a parent.
func gpusInSlices(objs []any, driver string) map[string]int {
	byNode := map[string][]*resourceapi.ResourceSlice{}
	for _, o := range objs {
		if s, ok := o.(*resourceapi.ResourceSlice); ok && s.Spec.NodeName != nil {
			byNode[*s.Spec.NodeName] = append(byNode[*s.Spec.NodeName], s)
		}
	}
	out := make(map[string]int, len(byNode))
	for node, list := range byNode {
		catalog, _ := dra.NewCatalog(list, node, driver, dra.DefaultAttributes())
		out[node] = catalog.PhysicalGPUs()
	}
	return out
}

// MaxGPUsPerNode is the most GPUs one node's annotation counts for: more than any server holds
// (a scenario's 64 included). The count is the breaker's budget, and the annotation is the node's
// own word: without a cap one 256 KiB annotation counted 6,121 GPUs and raised a 1,000-GPU
// cluster's budget sevenfold.
const MaxGPUsPerNode = 64

// PhysicalGPUs counts the GPUs (not MIG instances) in a gpu-health annotation, at most
// MaxGPUsPerNode; a malformed or absent annotation counts none.
func PhysicalGPUs(healthJSON string) int {
	return min(physicalGPUs(healthJSON), MaxGPUsPerNode)
}

// physicalGPUs is the uncapped count of PhysicalGPUs.
func physicalGPUs(healthJSON string) int {
	s, err := gpuhealthv1.ParseHealth(healthJSON)
	if err != nil {
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
