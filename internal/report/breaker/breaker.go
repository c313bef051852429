// Package breaker is the cluster-wide circuit breaker for disruptive taint effects. When more
// than a configured share of the cluster's GPUs would become NoSchedule or NoExecute within a
// window, something is more likely wrong with the detection (a bad driver roll-out, a firmware
// bug, a flapping rack) than with that many GPUs at once, and evicting or starving a large part of
// the cluster would do more harm than the faults. Past the budget, GPUs are tainted with effect
// None instead (still visible everywhere), loudly, until an operator acknowledges the wave
// (`gpuhealth breaker ack`) or it leaves the window.
//
// The budget is shared through one ConfigMap with optimistic concurrency: an agent records a GPU
// in it before escalating that GPU's taint, and a conflict means another agent got there first,
// so the reads are repeated. Every agent therefore sees the same count, even when a whole rack
// fails at once.
package breaker

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/internal/report/annotation"
	"github.com/gpuhealth/gpuhealth/internal/report/dradevices"
)

// The ConfigMap's name and keys.
const (
	ConfigMapName     = "gpuhealth-circuit-breaker"
	AdmittedKey       = "admitted"
	AcknowledgedAtKey = "acknowledgedAt"
)

// Entry records one GPU admitted to a disruptive effect.
type Entry struct {
	UUID string    `json:"uuid"`
	Node string    `json:"node"`
	At   time.Time `json:"at"`
}

// Options configure a Breaker.
type Options struct {
	Namespace string
	// MaxFraction of the cluster's GPUs that may turn NoSchedule/NoExecute within Window.
	MaxFraction float64
	Window      time.Duration
	Clock       clock.Clock
}

// Breaker decides, for one agent, whether a GPU may get a disruptive effect.
type Breaker struct {
	client   kubernetes.Interface
	nodeName string
	opts     Options
	nodes    corelisters.NodeLister

	mu   sync.Mutex
	held []string
}

// New returns a Breaker for the agent on nodeName.
func New(client kubernetes.Interface, nodeName string, opts Options) *Breaker {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Breaker{client: client, nodeName: nodeName, opts: opts}
}

// Start fills the cache of Nodes (the cluster's GPU count comes from their gpu-health
// annotations) and watches the breaker's ConfigMap, calling onChange when either changes: an
// acknowledgement or a shrinking wave may let held GPUs through.
func (b *Breaker) Start(ctx context.Context, onChange func()) error {
	nodeFactory := informers.NewSharedInformerFactory(b.client, 0)
	nodeInformer := nodeFactory.Core().V1().Nodes()
	if _, err := nodeInformer.Informer().AddEventHandler(dradevices.OnAnyChange(onChange)); err != nil {
		return err
	}
	cmFactory := informers.NewSharedInformerFactoryWithOptions(b.client, 0, informers.WithNamespace(b.opts.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ConfigMapName).String()
		}))
	if _, err := cmFactory.Core().V1().ConfigMaps().Informer().AddEventHandler(dradevices.OnAnyChange(onChange)); err != nil {
		return err
	}
	b.nodes = nodeInformer.Lister()
	nodeFactory.Start(ctx.Done())
	cmFactory.Start(ctx.Done())
	for _, f := range []informers.SharedInformerFactory{nodeFactory, cmFactory} {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("breaker: cache of %v did not sync", typ)
			}
		}
	}
	return nil
}

// ClusterGPUs counts the physical GPUs the agents report.
func (b *Breaker) ClusterGPUs() int {
	nodes, err := b.nodes.List(labels.Everything())
	if err != nil {
		return 0
	}
	total := 0
	for _, n := range nodes {
		var s map[string]report.GPUSummary
		if json.Unmarshal([]byte(n.Annotations[annotation.HealthKey]), &s) != nil {
			continue
		}
		for _, g := range s {
			if g.ParentUUID == "" {
				total++
			}
		}
	}
	return total
}

// Budget is how many GPUs may be admitted within the window for a cluster of total GPUs.
func (b *Breaker) Budget(total int) int {
	return max(1, int(math.Floor(b.opts.MaxFraction*float64(total))))
}

// Admit reports whether the GPU may get a disruptive effect now, recording it in the shared
// budget when it may. A GPU already admitted within the window stays admitted.
func (b *Breaker) Admit(ctx context.Context, uuid string) (bool, error) {
	total := b.ClusterGPUs()
	admitted := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		admitted = false
		cms := b.client.CoreV1().ConfigMaps(b.opts.Namespace)
		cm, err := cms.Get(ctx, ConfigMapName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: b.opts.Namespace}}
			if cm, err = cms.Create(ctx, cm, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), ConfigMapName, err)
			}
		}
		if err != nil {
			return err
		}
		entries := b.live(cm)
		if slices.ContainsFunc(entries, func(e Entry) bool { return e.UUID == uuid }) {
			admitted = true
			return nil
		}
		if len(entries) >= b.Budget(total) {
			return nil
		}
		entries = append(entries, Entry{UUID: uuid, Node: b.nodeName, At: b.opts.Clock.Now().UTC()})
		data, err := json.Marshal(entries)
		if err != nil {
			return err
		}
		cm = cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[AdmittedKey] = string(data)
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: "gpuhealth-agent"}); err != nil {
			return err // a conflict re-reads: another agent took budget meanwhile
		}
		admitted = true
		return nil
	})
	return admitted, err
}

// live returns the admissions still counting: inside the window and after the last
// acknowledgement.
func (b *Breaker) live(cm *corev1.ConfigMap) []Entry {
	var entries []Entry
	_ = json.Unmarshal([]byte(cm.Data[AdmittedKey]), &entries) // a damaged list counts as empty
	cutoff := b.opts.Clock.Now().Add(-b.opts.Window)
	if ack, err := time.Parse(time.RFC3339Nano, cm.Data[AcknowledgedAtKey]); err == nil && ack.After(cutoff) {
		cutoff = ack
	}
	return slices.DeleteFunc(entries, func(e Entry) bool { return !e.At.After(cutoff) })
}

// SetHeld records which of this node's GPUs the breaker holds back now and reports whether that
// changed.
func (b *Breaker) SetHeld(uuids []string) bool {
	slices.Sort(uuids)
	b.mu.Lock()
	defer b.mu.Unlock()
	if slices.Equal(uuids, b.held) {
		return false
	}
	b.held = uuids
	return true
}

// Held returns the GPUs of this node held back.
func (b *Breaker) Held() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.held)
}

// Acknowledge lets the held GPUs through: admissions before now no longer count.
func Acknowledge(ctx context.Context, client kubernetes.Interface, namespace string, now time.Time) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cms := client.CoreV1().ConfigMaps(namespace)
		cm, err := cms.Get(ctx, ConfigMapName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil // nothing admitted, nothing held
		}
		if err != nil {
			return err
		}
		cm = cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[AcknowledgedAtKey] = now.UTC().Format(time.RFC3339Nano)
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: "gpuhealth-breaker"})
		return err
	})
}
