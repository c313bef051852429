package extender

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/heartbeat"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// podFieldSelector keeps only the pods that can hold GPUs: scheduled and not finished. A pod
// that finishes leaves the selector and arrives as a delete.
const podFieldSelector = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"

// listener hears what the informers learn that matters to a pod the extender rejected: a node
// that can hold more than before, and a pod that is bound (or gone), which needs no retry.
type listener interface {
	nodeImproved(name string)
	forget(uid types.UID)
}

// start runs node and pod informers that feed s, and waits for their first list. l, which may be
// nil, hears from the informers' handlers and must not block them.
func (s *state) start(ctx context.Context, client kubernetes.Interface, agentNamespace string, l listener) error {
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
	onNode := func(n *corev1.Node) {
		warnings, better := s.setNode(n)
		for _, w := range warnings {
			logger.Info("Ignoring part of a GPU health annotation", "node", klog.KObj(n), "warning", w)
		}
		if better && l != nil {
			l.nodeImproved(n.Name)
		}
	}
	nodeReg, err := nodeInf.AddEventHandler(kube.Handlers(onNode, func(n *corev1.Node) { s.deleteNode(n.Name) }))
	if err != nil {
		return err
	}

	podInf := pods.Core().V1().Pods().Informer()
	if err := podInf.SetTransform(trimPod); err != nil {
		return err
	}
	onPod := func(p *corev1.Pod) {
		h, holds, warning := scheduling.PodHold(p)
		if warning != "" {
			logger.Info("Pod's GPU share is not charged to a card", "pod", klog.KObj(p), "warning", warning)
		}
		s.observe(p.UID, h, holds)
		if l != nil && p.Spec.NodeName != "" {
			l.forget(p.UID) // bound: nothing to retry
		}
	}
	podReg, err := podInf.AddEventHandler(kube.Handlers(onPod, func(p *corev1.Pod) {
		s.forget(p.UID)
		if l != nil {
			l.forget(p.UID)
		}
	}))
	if err != nil {
		return err
	}

	synced := []cache.InformerSynced{nodeReg.HasSynced, podReg.HasSynced}
	if agentNamespace != "" {
		// The agents' heartbeats (gpuhealthv1.HeartbeatLeaseName), only the renewal kept.
		leases := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(agentNamespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.LabelSelector = gpuhealthv1.HeartbeatLeaseLabel + "=true"
			}))
		leaseInf := leases.Coordination().V1().Leases().Informer()
		if err := leaseInf.SetTransform(heartbeat.TrimLease); err != nil {
			return err
		}
		onLease := func(lease *coordinationv1.Lease, present bool) {
			renewed := time.Time{}
			if lease.Spec.HolderIdentity == nil {
				return
			}
			node := *lease.Spec.HolderIdentity
			if lease.Name != gpuhealthv1.HeartbeatLeaseName(node) {
				return // not that node's Lease: a name it cannot have
			}
			if present {
				renewed = heartbeat.Renewed(lease, node)
			}
			if s.setLease(node, renewed) && l != nil {
				l.nodeImproved(node)
			}
		}
		leaseReg, err := leaseInf.AddEventHandler(kube.Handlers(func(lease *coordinationv1.Lease) { onLease(lease, true) },
			func(lease *coordinationv1.Lease) { onLease(lease, false) }))
		if err != nil {
			return err
		}
		leases.Start(ctx.Done())
		synced = append(synced, leaseReg.HasSynced)
	}
	nodes.Start(ctx.Done())
	pods.Start(ctx.Done())
	// The handlers, not just the stores, must have seen the first list: state is fed by them.
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("node, pod and heartbeat Lease informers did not sync: %w", context.Cause(ctx))
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
	for _, key := range []string{gpuhealthv1.UnhealthyIDsKey, gpuhealthv1.HealthKey, gpuhealthv1.DrainsKey, gpuhealthv1.HAMiCordonKey, gpuhealthv1.HeartbeatKey} {
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
