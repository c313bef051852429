// Package breaker is the cluster-wide circuit breaker for disruptive taint effects. When more
// than a configured share of the cluster's GPUs would become NoSchedule or NoExecute within a
// window, something is more likely wrong with the detection (a bad driver roll-out, a firmware
// bug, a flapping rack) than with that many GPUs at once, and evicting or starving a large part of
// the cluster would do more harm than the faults. Past the budget, GPUs are tainted with effect
// None instead (still visible everywhere), loudly, until an operator acknowledges the wave
// (`gpuhealth breaker ack`) or it leaves the window.
//
// The design has to hold at fleet scale, where hundreds of agents ask at the same instant:
//
//   - The budget is made of slots: coordination.k8s.io Leases named gpuhealth-breaker-slot-<k>
//     for k below the budget, in the breaker's namespace. An agent admits a GPU by creating a free
//     slot, which the API server does atomically: two agents can never hold the same slot, so
//     the budget cannot be overrun, and agents racing for different slots do not conflict (one
//     shared object with optimistic concurrency admitted one GPU per round, and a 400-GPU wave
//     took 28 s). A slot counts from its creationTimestamp, the API server's time, not any time
//     an agent wrote; slots that left the window are deleted by the controller's Sweeper, never
//     taken over, and the admission policy lets an agent create only slots naming its own node
//     and change or delete none (see SlotPool).
//   - The cluster's GPU count comes from one place: the Counter (`gpuhealth breaker controller`,
//     one leader-elected Deployment) watches the Nodes' gpu-health annotations and writes the
//     count into the ConfigMap gpuhealth-circuit-breaker. Agents only watch that ConfigMap by name,
//     never every Node (which would send every Node update to every agent).
//   - An acknowledgement is a time in the same ConfigMap: slots taken before it stop counting.
//
// Without a count (no Counter has run yet) the breaker admits every escalation and says so: a
// missing count must not keep sick GPUs schedulable.
package breaker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// The ConfigMap, its keys, and the slots.
const (
	ConfigMapName     = "gpuhealth-circuit-breaker"
	ClusterGPUsKey    = "clusterGPUs"
	CountedAtKey      = "countedAt"
	AcknowledgedAtKey = "acknowledgedAt"
	// SlotPrefix names the slot Leases: gpuhealth-breaker-slot-0, -1, ...
	SlotPrefix = "gpuhealth-breaker-slot-"
	// SlotLabel marks the slot Leases, for listing them.
	SlotLabel = "gpuhealth.dev/breaker-slot"
)

// Options configure a Breaker.
type Options struct {
	Namespace string
	// MaxFraction of the cluster's GPUs that may turn NoSchedule/NoExecute within Window.
	MaxFraction float64
	Window      time.Duration
	Clock       clock.Clock
	// Domains add a budget per value of a node label (domains.go); NodeLabels returns the
	// agent's node's labels, required with Domains.
	Domains    []Domain
	NodeLabels func(context.Context) (map[string]string, error)
}

// Breaker decides, for one agent, whether a GPU may get a disruptive effect.
type Breaker struct {
	client   kube.Interface
	nodeName string
	opts     Options
	config   corelisters.ConfigMapLister
	onChange func()

	mu   sync.Mutex
	held []string
	// refusedBy is the domain (label=value) that last refused each GPU; absent: the cluster's
	// budget did, or none.
	refusedBy   map[string]string
	recheckAt   time.Time // when a pending re-check fires (zero: none pending)
	warnedCount bool
	// warnedUnswept: the warning that unswept slots block the budget was logged.
	warnedUnswept bool
	stopped       bool
}

// New returns a Breaker for the agent on nodeName.
func New(client kube.Interface, nodeName string, opts Options) *Breaker {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Breaker{client: client, nodeName: nodeName, opts: opts, onChange: func() {}}
}

// Start watches the breaker's ConfigMap (by name: one object, one event per change) and calls
// onChange when it changes or a slot leaves the window: an acknowledgement, a new count or an
// expiry may let held GPUs through.
func (b *Breaker) Start(ctx context.Context, onChange func()) error {
	var informers kube.Informers
	inf := informers.Add(kube.NewInformer(b.client, b.client.CoreV1().ConfigMaps(b.opts.Namespace), &corev1.ConfigMap{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ConfigMapName).String()
	}))
	if _, err := inf.AddEventHandler(dradevices.OnAnyChange(onChange)); err != nil {
		return err
	}
	b.config, b.onChange = corelisters.NewConfigMapLister(inf.GetIndexer()), onChange
	informers.Start(ctx)
	if err := informers.WaitForCacheSync(ctx); err != nil {
		return fmt.Errorf("breaker: %w", err)
	}
	go func() {
		<-ctx.Done()
		informers.Shutdown()
		b.mu.Lock()
		b.stopped = true
		b.mu.Unlock()
	}()
	return nil
}

// state is what the ConfigMap says: the cluster's GPU count (0 when unknown), the last
// acknowledgement and, with domains, each domain value's GPUs.
func (b *Breaker) state() (clusterGPUs int, acknowledged time.Time, domains DomainGPUs) {
	if b.config == nil {
		return 0, time.Time{}, nil
	}
	cm, err := b.config.ConfigMaps(b.opts.Namespace).Get(ConfigMapName)
	if err != nil {
		return 0, time.Time{}, nil
	}
	clusterGPUs, acknowledged = ParseState(cm)
	if len(b.opts.Domains) > 0 {
		domains = ParseDomainGPUs(cm)
	}
	return clusterGPUs, acknowledged, domains
}

// Budget is how many GPUs may be admitted within the window for a cluster of total GPUs.
func (b *Breaker) Budget(total int) int {
	return Budget(b.opts.MaxFraction, total)
}

// Budget is max(1, floor(fraction × total)).
func Budget(fraction float64, total int) int {
	return max(1, int(math.Floor(fraction*float64(total))))
}

// errSlotsBusy: every attempt lost a race for a free slot; the caller retries later.
var errSlotsBusy = errors.New("circuit breaker: lost every race for a free slot; retrying")

// Admit reports whether the GPU may get a disruptive effect now, taking a slot when it may. A
// GPU holding a live slot stays admitted. With domains, the GPU needs a slot of its node's value
// of every domain label first, then one of the cluster's; a slot taken here for a domain is
// released again when a later budget refuses, so that a held GPU holds no domain's budget.
func (b *Breaker) Admit(ctx context.Context, uuid string) (bool, error) {
	total, acknowledged, counted := b.state()
	if total == 0 {
		b.warnNoCount(ctx)
		return true, nil
	}
	domains, err := b.nodeDomains(ctx, counted)
	if err != nil {
		return false, err
	}
	var taken []*Slot // domain slots taken by this call
	release := func() {
		for _, s := range taken {
			if err := BreakerSlots(b.client, b.opts.Namespace).Release(ctx, *s); err != nil {
				// The slot counts until the window or the Sweeper ends it: the domain's budget
				// is the smaller for that while, never overrun.
				klog.FromContext(ctx).Error(err, "Releasing a circuit-breaker domain slot failed", "gpu", uuid)
			}
		}
	}
	for _, d := range domains {
		ok, s, err := b.admitIn(ctx, DomainSlots(b.client, b.opts.Namespace, d.Label, d.Value), d.Budget, acknowledged, uuid)
		if err != nil || !ok {
			release()
			b.refused(uuid, d.String())
			return false, err
		}
		if s != nil {
			taken = append(taken, s)
		}
	}
	ok, _, err := b.admitIn(ctx, BreakerSlots(b.client, b.opts.Namespace), b.Budget(total), acknowledged, uuid)
	if err != nil || !ok {
		release()
		b.refused(uuid, "")
		return false, err
	}
	b.refused(uuid, "")
	return true, nil
}

// nodeDomains are the domain budgets the agent's node is under now.
func (b *Breaker) nodeDomains(ctx context.Context, counted DomainGPUs) ([]DomainBudget, error) {
	if len(b.opts.Domains) == 0 || len(counted) == 0 {
		return nil, nil
	}
	if b.opts.NodeLabels == nil {
		return nil, errors.New("circuit breaker: domains need the node's labels")
	}
	labels, err := b.opts.NodeLabels(ctx)
	if err != nil {
		return nil, fmt.Errorf("circuit breaker: the node's labels: %w", err)
	}
	return NodeDomains(b.opts.Domains, labels, counted), nil
}

// admitIn admits the GPU in one pool of budget slots: it reports whether the GPU holds a live
// slot there, and the slot when this call took it.
func (b *Breaker) admitIn(ctx context.Context, pool SlotPool, budget int, acknowledged time.Time, uuid string) (bool, *Slot, error) {
	for range 5 {
		now := b.opts.Clock.Now()
		cutoff := Cutoff(now, b.opts.Window, acknowledged)
		slots, err := pool.List(ctx)
		if err != nil {
			return false, nil, err
		}
		live, oldest := 0, time.Time{}
		taken := map[int]Slot{}
		for _, s := range slots {
			taken[s.Index] = s
			if !s.Live(cutoff) {
				continue
			}
			if s.Node == b.nodeName && s.UUID == uuid {
				return true, nil, nil
			}
			live++
			if oldest.IsZero() || s.At.Before(oldest) {
				oldest = s.At
			}
		}
		if live >= budget {
			b.scheduleRecheck(oldest.Add(b.opts.Window))
			return false, nil, nil
		}
		// Try a few free slots in random order: agents racing through a wave spread out. A slot
		// that stopped counting is not free until the breaker controller's Sweeper deletes it.
		var free []int
		for k := range budget {
			if _, ok := taken[k]; !ok {
				free = append(free, k)
			}
		}
		if len(free) == 0 {
			// Room in the budget, but only behind slots that no longer count: the breaker
			// controller's Sweeper deletes them as they leave the window. Look again shortly.
			b.scheduleRecheck(now.Add(sweepGrace))
			b.warnUnswept(ctx)
			return false, nil, nil
		}
		rand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
		for _, k := range free[:min(len(free), 3)] {
			s, err := pool.take(ctx, k, taken, SlotClaim{Node: b.nodeName, UUID: uuid, At: now})
			if err != nil {
				return false, nil, fmt.Errorf("circuit breaker: %w", err)
			}
			if s != nil {
				return true, s, nil
			}
		}
	}
	return false, nil, errSlotsBusy
}

// refused records which domain refused the GPU ("" : the cluster's budget, or none).
func (b *Breaker) refused(uuid, domain string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if domain == "" {
		delete(b.refusedBy, uuid)
		return
	}
	if b.refusedBy == nil {
		b.refusedBy = map[string]string{}
	}
	b.refusedBy[uuid] = domain
}

// HeldDomains are the domains (label=value) whose budgets hold back GPUs of this node now,
// sorted; empty when only the cluster's budget holds them, or nothing is held.
func (b *Breaker) HeldDomains() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, uuid := range b.held {
		if d, ok := b.refusedBy[uuid]; ok && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// scheduleRecheck asks for another look when the oldest live slot leaves the window, unless an
// earlier look is already due.
func (b *Breaker) scheduleRecheck(at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.recheckAt.IsZero() && !at.Before(b.recheckAt) {
		return
	}
	b.recheckAt = at
	after := b.opts.Clock.After(max(at.Sub(b.opts.Clock.Now()), time.Second))
	go func() {
		<-after
		b.mu.Lock()
		due := b.recheckAt.Equal(at) && !b.stopped
		if due {
			b.recheckAt = time.Time{}
		}
		b.mu.Unlock()
		if due {
			b.onChange()
		}
	}()
}

// sweepGrace is how soon the breaker looks again when only unswept slots stand in the way.
const sweepGrace = 5 * time.Second

func (b *Breaker) warnUnswept(ctx context.Context) {
	b.warnOnce(ctx, &b.warnedUnswept, "Warning: the circuit breaker has room in its budget, but only behind slots of other nodes that no longer count; "+
		"holding escalations until the breaker controller sweeps them (is `gpuhealth breaker controller` running?)", "namespace", b.opts.Namespace)
}

func (b *Breaker) warnNoCount(ctx context.Context) {
	b.warnOnce(ctx, &b.warnedCount, "The circuit breaker has no cluster GPU count yet (is `gpuhealth breaker controller` running?); admitting every escalation",
		"configMap", b.opts.Namespace+"/"+ConfigMapName)
}

// warnOnce logs msg the first time *warned is false.
func (b *Breaker) warnOnce(ctx context.Context, warned *bool, msg string, kv ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if *warned {
		return
	}
	*warned = true
	klog.FromContext(ctx).Info(msg, kv...)
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
