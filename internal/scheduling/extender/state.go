package extender

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// podFieldSelector keeps only the pods that can hold GPUs: scheduled and not finished. A pod
// that finishes leaves the selector and arrives as a delete.
const podFieldSelector = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"

// nodeEntry is a parsed node; entries are replaced, never changed, so a reader may keep one.
type nodeEntry struct {
	gpus            scheduling.NodeGPUs
	resourceVersion string
	warnings        []string
}

// state is what the extender knows about the cluster: each node's GPUs, parsed once per change,
// and what the pods on each node hold, kept up to date by informer events so that a request
// costs no API call and no scan of all pods.
type state struct {
	mu    sync.RWMutex
	nodes map[string]*nodeEntry
	holds map[types.UID]holdEntry
	usage map[string]*scheduling.Usage
}

func newState() *state {
	return &state{
		nodes: map[string]*nodeEntry{},
		holds: map[types.UID]holdEntry{},
		usage: map[string]*scheduling.Usage{},
	}
}

// setNode parses node and stores it. It returns the warnings when they differ from the node's
// previous ones, so that each problem is logged once, not at every status heartbeat, and whether
// the node can now hold work it could not before (see improved).
func (s *state) setNode(node *corev1.Node) (newWarnings []string, better bool) {
	gpus, warnings := scheduling.ParseNode(node)
	e := &nodeEntry{gpus: gpus, resourceVersion: node.ResourceVersion, warnings: warnings}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.nodes[node.Name]
	s.nodes[node.Name] = e
	if prev == nil {
		return warnings, true
	}
	better = improved(&prev.gpus, &gpus)
	if !slices.Equal(prev.warnings, warnings) {
		return warnings, better
	}
	return nil, better
}

func (s *state) deleteNode(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.nodes, name)
}

// holdEntry is what one pod holds; assumed entries come from our own /bind, before the pod
// informer has seen the pod bound.
type holdEntry struct {
	hold    scheduling.Hold
	assumed bool
}

// observe records what the pod informer says the pod with uid holds. A pod the informer shows
// holding nothing keeps a hold /bind assumed for it: an event from before the binding (our own
// annotation patch) must not undo the charge.
func (s *state) observe(uid types.UID, h scheduling.Hold, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, had := s.holds[uid]; had && e.assumed && !ok {
		return
	}
	s.setLocked(uid, holdEntry{hold: h}, ok)
}

// forget removes what the pod with uid holds (the pod is gone).
func (s *state) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(uid, holdEntry{}, false)
}

// assume charges h to the pod with uid until the pod informer sees the pod bound.
func (s *state) assume(uid types.UID, h scheduling.Hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(uid, holdEntry{hold: h, assumed: true}, true)
}

func (s *state) setLocked(uid types.UID, e holdEntry, ok bool) {
	if old, had := s.holds[uid]; had {
		u := s.usage[old.hold.Node]
		u.Remove(old.hold)
		if u.GPUs == 0 && len(u.CardMemory) == 0 {
			delete(s.usage, old.hold.Node)
		}
		delete(s.holds, uid)
	}
	if !ok {
		return
	}
	s.holds[uid] = e
	u := s.usage[e.hold.Node]
	if u == nil {
		u = &scheduling.Usage{}
		s.usage[e.hold.Node] = u
	}
	u.Add(e.hold)
}

// usageLocked returns the usage of a node; the caller holds mu and must not keep the maps.
func (s *state) usageLocked(node string) scheduling.Usage {
	if u := s.usage[node]; u != nil {
		return *u
	}
	return scheduling.Usage{}
}

// nodeLocked returns the parsed node from the cache; when the request carries the node object
// too, the cached parse is used only if it is of the same resourceVersion.
func (s *state) nodeLocked(name string, fromRequest *corev1.Node) (*scheduling.NodeGPUs, []string) {
	e := s.nodes[name]
	if fromRequest == nil {
		if e == nil {
			return nil, nil
		}
		return &e.gpus, nil
	}
	if e != nil && e.resourceVersion == fromRequest.ResourceVersion && fromRequest.ResourceVersion != "" {
		return &e.gpus, nil
	}
	gpus, warnings := scheduling.ParseNode(fromRequest)
	return &gpus, warnings
}

// listener hears what the informers learn that matters to a pod the extender rejected: a node
// that can hold more than before, and a pod that is bound (or gone), which needs no retry.
type listener interface {
	nodeImproved(name string)
	forget(uid types.UID)
}

// start runs node and pod informers that feed s, and waits for their first list. l, which may be
// nil, hears from the informers' handlers and must not block them.
func (s *state) start(ctx context.Context, client kubernetes.Interface, l listener) error {
	logger := klog.FromContext(ctx)
	nodes := informers.NewSharedInformerFactory(client, 0)
	pods := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = podFieldSelector
	}))

	nodeInf := nodes.Core().V1().Nodes().Informer()
	// Only capacity and annotations matter; dropping the rest keeps 5,000 nodes small.
	if err := nodeInf.SetTransform(trimNode); err != nil {
		return err
	}
	onNode := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			warnings, better := s.setNode(n)
			for _, w := range warnings {
				logger.Info("Ignoring part of a GPU health annotation", "node", klog.KObj(n), "warning", w)
			}
			if better && l != nil {
				l.nodeImproved(n.Name)
			}
		}
	}
	nodeReg, err := nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onNode,
		UpdateFunc: func(_, obj any) { onNode(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				s.deleteNode(n.Name)
			}
		},
	})
	if err != nil {
		return err
	}

	podInf := pods.Core().V1().Pods().Informer()
	if err := podInf.SetTransform(trimPod); err != nil {
		return err
	}
	onPod := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		h, holds, warning := scheduling.PodHold(p)
		if warning != "" {
			logger.Info("Pod's GPU share is not charged to a card", "pod", klog.KObj(p), "warning", warning)
		}
		s.observe(p.UID, h, holds)
		if l != nil && p.Spec.NodeName != "" {
			l.forget(p.UID) // bound: nothing to retry
		}
	}
	podReg, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onPod,
		UpdateFunc: func(_, obj any) { onPod(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				s.forget(p.UID)
				if l != nil {
					l.forget(p.UID)
				}
			}
		},
	})
	if err != nil {
		return err
	}

	nodes.Start(ctx.Done())
	pods.Start(ctx.Done())
	// The handlers, not just the stores, must have seen the first list: state is fed by them.
	if !cache.WaitForCacheSync(ctx.Done(), nodeReg.HasSynced, podReg.HasSynced) {
		return fmt.Errorf("node and pod informers did not sync: %w", context.Cause(ctx))
	}
	return nil
}

// trimNode keeps what ParseNode reads.
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	out := &corev1.Node{}
	out.Name, out.UID, out.ResourceVersion = n.Name, n.UID, n.ResourceVersion
	for _, key := range []string{gpuhealthv1.UnhealthyIDsKey, gpuhealthv1.HealthKey, gpuhealthv1.DrainsKey, gpuhealthv1.HAMiCordonKey} {
		if v, ok := n.Annotations[key]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[key] = v
		}
	}
	out.Status.Capacity = n.Status.Capacity
	return out, nil
}

// trimPod keeps what PodHold reads.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{}
	out.Name, out.Namespace, out.UID, out.ResourceVersion = p.Name, p.Namespace, p.UID, p.ResourceVersion
	out.Annotations = p.Annotations
	out.Spec.NodeName = p.Spec.NodeName
	out.Status.Phase = p.Status.Phase
	trim := func(cs []corev1.Container) []corev1.Container {
		if len(cs) == 0 {
			return nil
		}
		out := make([]corev1.Container, len(cs))
		for i, c := range cs {
			out[i] = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
		}
		return out
	}
	out.Spec.Containers, out.Spec.InitContainers = trim(p.Spec.Containers), trim(p.Spec.InitContainers)
	return out, nil
}
