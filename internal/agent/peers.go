package agent

import (
	"context"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// peerWatcher follows the other nodes of this node's NVLink domain (the nodes whose domain
// label has this node's value: the 18 nodes of a GB200 NVL72 rack) and hands the faults their
// agents report (the gpu-health annotation's xidFaults) to the monitor, which attributes to
// them the XIDs this node's driver says an earlier XID caused. A node without the label watches
// nothing: one watch, server-side filtered by the label, only where a domain exists. When the
// label's value changes (a node moved to another rack, GPU feature discovery labelled it late),
// the watch follows it.
//
// A peer's malformed annotation is reported and its faults last read are kept: a typo must not
// turn an attribution back into a fault of this node's GPU, nor the reverse.
type peerWatcher struct {
	client  kube.Interface
	nodes   *nodecache.Cache // this agent's own Node
	label   string
	monitor *health.Monitor
	clock   clock.PassiveClock

	mu     sync.Mutex
	faults map[string][]health.PeerFault // by peer node, as last read well
	bad    map[string]string             // peer node to the annotation it could not read, reported once
}

// run follows the domain until ctx is done.
func (w *peerWatcher) run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("watcher", "peers", "label", w.label)
	ctx = klog.NewContext(ctx, logger)
	domains := make(chan string, 1)
	if err := w.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { offerDomain(domains, obj, w.label) },
		UpdateFunc: func(_, obj any) { offerDomain(domains, obj, w.label) },
	}); err != nil {
		return err
	}
	if err := w.nodes.Start(ctx); err != nil {
		return err
	}
	var domain string
	var current *domainWatch
	defer func() { current.stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-domains:
			if d == domain {
				continue
			}
			current.stop()
			domain, current = d, nil
			w.reset(ctx)
			if d == "" {
				logger.Info("This node is in no NVLink domain; watching no peers")
				continue
			}
			logger.Info("Watching the other nodes of this node's NVLink domain", "domain", d)
			current = w.startWatch(ctx, d)
		}
	}
}

// domainWatch is the running watch of one domain's nodes.
type domainWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (w *peerWatcher) startWatch(ctx context.Context, domain string) *domainWatch {
	ctx, cancel := context.WithCancel(ctx)
	dw := &domainWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(dw.done)
		w.watch(ctx, domain)
	}()
	return dw
}

// stop ends the watch and waits for its informer; nil is a watch that never ran.
func (dw *domainWatch) stop() {
	if dw == nil {
		return
	}
	dw.cancel()
	<-dw.done
}

// offerDomain hands the latest domain label value to the watcher, replacing one not yet taken.
func offerDomain(domains chan string, obj any, label string) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	d := node.Labels[label]
	select {
	case <-domains:
	default:
	}
	domains <- d
}

// reset forgets every peer: a new domain has other peers.
func (w *peerWatcher) reset(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := len(w.faults) > 0
	w.faults, w.bad = map[string][]health.PeerFault{}, map[string]string{}
	if had {
		w.publishLocked(ctx)
	}
}

// watch runs an informer of the domain's other nodes until ctx is done.
func (w *peerWatcher) watch(ctx context.Context, domain string) {
	self := w.nodes.NodeName()
	inf := kube.NewInformer(w.client, w.client.CoreV1().Nodes(), &corev1.Node{}, func(o *metav1.ListOptions) {
		o.LabelSelector = labels.SelectorFromSet(labels.Set{w.label: domain}).String()
		o.FieldSelector = fields.OneTermNotEqualSelector("metadata.name", self).String()
	})
	update := func(obj any) {
		if node, ok := obj.(*corev1.Node); ok {
			w.read(ctx, node)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, obj any) { update(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if node, ok := obj.(*corev1.Node); ok {
				w.forget(ctx, node.Name)
			}
		},
	})
	inf.RunWithContext(ctx)
}

// read takes a peer's reported faults.
func (w *peerWatcher) read(ctx context.Context, node *corev1.Node) {
	logger := klog.FromContext(ctx)
	value := node.Annotations[gpuhealthv1.HealthKey]
	summaries, err := gpuhealthv1.ParseHealth(value)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if w.bad[node.Name] != value {
			w.bad[node.Name] = value
			logger.Error(err, "Ignoring a peer's malformed report; keeping its faults last read", "peer", node.Name)
		}
		return
	}
	delete(w.bad, node.Name)
	faults := gpuhealthv1.PeerFaults(node.Name, summaries)
	if slices.Equal(faults, w.faults[node.Name]) {
		return // the peer's annotation changed elsewhere, or another of its fields did
	}
	if len(faults) == 0 {
		delete(w.faults, node.Name)
	} else {
		w.faults[node.Name] = faults
	}
	logger.V(2).Info("A peer's faults changed", "peer", node.Name, "faults", len(faults))
	w.publishLocked(ctx)
}

// forget drops a peer that left the domain or was deleted.
func (w *peerWatcher) forget(ctx context.Context, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.bad, name)
	if _, ok := w.faults[name]; !ok {
		return
	}
	delete(w.faults, name)
	w.publishLocked(ctx)
}

func (w *peerWatcher) publishLocked(ctx context.Context) {
	var all []health.PeerFault
	for _, f := range w.faults {
		all = append(all, f...)
	}
	if err := w.monitor.SetPeerFaults(all, w.clock.Now()); err != nil {
		klog.FromContext(ctx).Error(err, "Dropped invalid peer faults")
	}
}
