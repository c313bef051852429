package claimstatus

import (
	"context"
	"slices"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// podClaims finds the node's claims through a watch of the pods bound to it (selected by
// spec.nodeName, a selector the API server indexes), for kubelets that do not name claims in
// pod-resources. It needs cluster-wide pods list/watch: RBAC cannot confine a reader of pods
// to one node's.
type podClaims struct {
	pods     corelisters.PodLister
	nodeName string
}

// watchPods starts the watch and returns once its cache is filled; trigger hears of pods whose
// claims come and go.
func watchPods(ctx context.Context, client kube.Interface, nodeName string, trigger func()) (*podClaims, error) {
	var informers kube.Informers
	podInformer := informers.Add(kube.NewInformer(client, client.CoreV1().Pods(""), &corev1.Pod{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	}))
	// Only the pod's name and claims are kept: the cache holds every pod of the node.
	if err := podInformer.SetTransform(claimsOnly); err != nil {
		return nil, err
	}
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); !ok || len(dra.PodClaimNames(pod)) > 0 {
				trigger()
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Pod)
			n, ok2 := newObj.(*corev1.Pod)
			if !ok1 || !ok2 || !slices.Equal(dra.PodClaimNames(o), dra.PodClaimNames(n)) {
				trigger()
			}
		},
		DeleteFunc: func(any) { trigger() },
	}); err != nil {
		return nil, err
	}
	informers.Start(ctx)
	if err := informers.WaitForCacheSync(ctx); err != nil {
		return nil, err
	}
	return &podClaims{pods: corelisters.NewPodLister(podInformer.GetIndexer()), nodeName: nodeName}, nil
}

// claimsOnly strips a pod down to what claims reads.
func claimsOnly(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName, ResourceClaims: pod.Spec.ResourceClaims},
		Status: corev1.PodStatus{
			ResourceClaimStatuses:       pod.Status.ResourceClaimStatuses,
			ExtendedResourceClaimStatus: pod.Status.ExtendedResourceClaimStatus,
		},
	}, nil
}

func (p *podClaims) claims(context.Context) (map[types.NamespacedName]bool, error) {
	pods, err := p.pods.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := map[types.NamespacedName]bool{}
	for _, pod := range pods {
		if pod.Spec.NodeName != p.nodeName {
			continue
		}
		for _, name := range dra.PodClaimNames(pod) {
			out[types.NamespacedName{Namespace: pod.Namespace, Name: name}] = true
		}
	}
	return out, nil
}
