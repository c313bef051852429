// Package records keeps every GPU's life cluster-side, by board serial: the breaker controller
// runs a Controller that watches the Nodes' gpu-health and gpu-drains annotations and merges
// what each reports of each GPU with a serial into its GPURecord (package gpurecord). A GPU gets
// a record when it first has something to remember; a node's deletion deletes nothing.
//
// Cost: one watch of the Nodes, whose cache keeps only the two annotations it reads, and one of
// the GPURecords. A record is written only when it changed: a new event, a new placement, or a
// placement's LastSeen older than gpurecord.LastSeenEvery. Reports that change nothing of a
// recorded GPU (most of them) write nothing.
package records

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
)

// Bounds on what the agents' reports can make the controller create: an agent names its GPUs'
// serials itself, so a node that made up a new serial in every report could otherwise fill etcd.
const (
	// NewRecordsPerNode is how many records one node's reports may create within
	// NewRecordsWindow: eight times an 8-GPU node's cards, which no node whose cards are all
	// replaced and all fail within a day reaches.
	NewRecordsPerNode = 64
	NewRecordsWindow  = 24 * time.Hour
	// DefaultMaxRecords bounds the records in all: 500,000 is 50,000 nodes of 8 GPUs, each card
	// replaced once and every card with a past; at most 10 KiB each, about 5 GiB of etcd at
	// worst, some 1 KiB each (a few events) for most.
	DefaultMaxRecords = 500_000
)

// Controller writes GPURecords from the agents' reports. Client and Records are required.
type Controller struct {
	Client  kube.Interface
	Records kube.GPURecordInterface
	Clock   clock.PassiveClock
	// MaxRecords bounds the records the controller creates (default DefaultMaxRecords): past
	// it, a GPU without a record gets none, and the controller says so.
	MaxRecords int
	// Written, when set, is called after each record written (created true for a new one).
	Written func(created bool)
}

// Run keeps the records until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	if c.Client == nil || c.Records == nil {
		return errors.New("gpu records: a client and a GPURecords client are required")
	}
	logger := klog.FromContext(ctx).WithValues("controller", "gpu-records")
	ctx = klog.NewContext(ctx, logger)
	var informers kube.Informers
	nodes := informers.Add(kube.NewInformer(c.Client, c.Client.CoreV1().Nodes(), &corev1.Node{}, nil))
	if err := nodes.SetTransform(func(obj any) (any, error) { return reportOnly(obj), nil }); err != nil {
		return err
	}
	recs := informers.Add(kube.NewInformer(nil, c.Records, &gpurecord.GPURecord{}, nil))
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu-records"})
	defer queue.ShutDown()
	if _, err := nodes.AddEventHandler(kube.Handlers(func(n *corev1.Node) { queue.Add(n.Name) }, nil)); err != nil {
		return err
	}
	st := &state{c: c, recs: recs.GetStore(), written: map[string]*gpurecord.GPURecord{}, warned: map[string]string{}, created: map[string][]time.Time{}}
	if _, err := recs.AddEventHandler(kube.Handlers(st.seen, nil)); err != nil {
		return err
	}
	return kube.Work(ctx, "gpu records", &informers, queue, func(name string) {
		obj, ok, err := nodes.GetStore().GetByKey(name)
		if err != nil || !ok {
			queue.Forget(name)
			return // deleted: its GPUs' records stay
		}
		if err := st.node(ctx, obj.(*corev1.Node)); err != nil {
			logger.Error(err, "Recording the GPUs of a node failed; retrying", "node", klog.KRef("", name))
			queue.AddRateLimited(name)
			return
		}
		queue.Forget(name)
	})
}

// reportOnly keeps of a Node what the records are made from: its name and two annotations.
func reportOnly(obj any) any {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj
	}
	kept := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion}}
	for _, key := range []string{gpuhealthv1.HealthKey, gpuhealthv1.DrainsKey} {
		if v, ok := n.Annotations[key]; ok {
			if kept.Annotations == nil {
				kept.Annotations = map[string]string{}
			}
			kept.Annotations[key] = v
		}
	}
	return kept
}

// state is what one Run keeps between nodes.
type state struct {
	c    *Controller
	recs cache.Store
	// written are the records this controller wrote that its cache has not shown yet, by name:
	// the next report of the same GPU merges into them, not into the older cached copy.
	mu      sync.Mutex
	written map[string]*gpurecord.GPURecord
	// warned are the nodes whose refused serials were logged, and what was refused.
	warned map[string]string
	// created are the times each node's reports created records, within NewRecordsWindow.
	created map[string][]time.Time
	// capWarned is set once the controller said it reached MaxRecords.
	capWarned bool
}

// seen forgets a written record once the cache holds that version (or a newer one).
func (st *state) seen(r *gpurecord.GPURecord) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if w, ok := st.written[r.Name]; ok && w.ResourceVersion == r.ResourceVersion {
		delete(st.written, r.Name)
	}
}

// current returns the newest copy of record name this controller knows, nil when there is none.
func (st *state) current(name string) *gpurecord.GPURecord {
	st.mu.Lock()
	w := st.written[name]
	st.mu.Unlock()
	if w != nil {
		return w.DeepCopy()
	}
	obj, ok, _ := st.recs.GetByKey(name)
	if !ok {
		return nil
	}
	return obj.(*gpurecord.GPURecord).DeepCopy()
}

// node merges one node's report into its GPUs' records.
func (st *state) node(ctx context.Context, n *corev1.Node) error {
	logger := klog.FromContext(ctx)
	v := n.Annotations[gpuhealthv1.HealthKey]
	if v == "" {
		return nil
	}
	summaries, bad, err := gpuhealthv1.ParseHealthEach(v)
	if err != nil {
		return nil // not a report: the readers of the annotation say so; nothing to record
	}
	if len(bad) > 0 {
		logger.V(4).Info("Entries of a node's report do not decode", "node", klog.KObj(n), "entries", bad)
	}
	drains := gpuhealthv1.ReadDrains(n.Annotations[gpuhealthv1.DrainsKey], nil)
	obs, refused := nodeObservations(n.Name, summaries, drains)
	if msg := fmt.Sprint(refused); len(refused) > 0 && st.warned[n.Name] != msg {
		st.warned[n.Name] = msg
		logger.Info("Warning: a node reports GPU serials no GPU has; they get no record", "node", klog.KObj(n), "serials", refused)
	}
	var errs []error
	now := st.clock().Now()
	for serial, o := range obs {
		if err := st.record(ctx, serial, o, now); err != nil {
			errs = append(errs, fmt.Errorf("GPU %d (serial %s): %w", o.Index, serial, err))
		}
	}
	return errors.Join(errs...)
}

func (st *state) clock() clock.PassiveClock {
	if st.c.Clock != nil {
		return st.c.Clock
	}
	return clock.RealClock{}
}

// record merges o into the record of serial, creating it when o has events, and writes it when
// it changed.
func (st *state) record(ctx context.Context, serial string, o gpurecord.Observation, now time.Time) error {
	name := gpurecord.NameFor(serial)
	rec := st.current(name)
	created := rec == nil
	if created {
		if !o.HasEvents() {
			return nil
		}
		if !st.mayCreate(ctx, o.Node, now) {
			return nil
		}
		rec = &gpurecord.GPURecord{ObjectMeta: metav1.ObjectMeta{Name: name}, Serial: serial}
	}
	if !gpurecord.Observe(rec, o, now) {
		return nil
	}
	var out *gpurecord.GPURecord
	var err error
	if created {
		out, err = st.c.Records.Create(ctx, rec, metav1.CreateOptions{FieldManager: "gpuhealth-breaker-controller"})
	} else {
		out, err = st.c.Records.Update(ctx, rec, metav1.UpdateOptions{FieldManager: "gpuhealth-breaker-controller"})
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		st.forget(name) // someone else's version is newer: retry from the cache once it has it
	}
	if err != nil {
		return err
	}
	st.mu.Lock()
	st.written[name] = out
	st.mu.Unlock()
	if created {
		st.created[o.Node] = append(st.created[o.Node], now)
	}
	if st.c.Written != nil {
		st.c.Written(created)
	}
	klog.FromContext(ctx).V(2).Info("Recorded a GPU", "record", name, "node", o.Node, "gpu", o.Index, "created", created)
	return nil
}

func (st *state) forget(name string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.written, name)
}

// mayCreate reports whether node's report may create one more record at now: the node created
// fewer than NewRecordsPerNode within NewRecordsWindow, and there are fewer than MaxRecords.
func (st *state) mayCreate(ctx context.Context, node string, now time.Time) bool {
	logger := klog.FromContext(ctx)
	recent := st.created[node]
	for len(recent) > 0 && now.Sub(recent[0]) >= NewRecordsWindow {
		recent = recent[1:]
	}
	if len(recent) == 0 {
		delete(st.created, node)
	} else {
		st.created[node] = recent
	}
	if len(recent) >= NewRecordsPerNode {
		logger.Info("Warning: a node reported more new GPU serials than it has cards; no record for this one", "node", klog.KRef("", node),
			"created", len(recent), "within", NewRecordsWindow)
		return false
	}
	limit := st.c.MaxRecords
	if limit <= 0 {
		limit = DefaultMaxRecords
	}
	if n := len(st.recs.ListKeys()); n >= limit {
		if !st.capWarned {
			st.capWarned = true
			logger.Info("Warning: the GPU records reached their bound; GPUs without a record get none", "records", n, "max", limit)
		}
		return false
	}
	return true
}
