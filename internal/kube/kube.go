// Package kube is the narrow Kubernetes client of gpuhealth's node-side code: the agent, its
// reporters, caches, breaker and remediation use only Nodes, Pods, Events, ConfigMaps, Leases,
// ResourceSlices, ResourceClaims and DeviceTaintRules, so they take an Interface with only those
// instead of client-go's kubernetes.Interface.
//
// Why not client-go's clientset: importing any of its typed clients imports
// k8s.io/client-go/kubernetes/scheme, which registers every API group Kubernetes serves (56
// packages). Their registration code and type data are linked into the binary and touched at
// start, and they made up about a third of the lean agent's resident memory (issue 18). This
// package builds the same typed clients (client-go's gentype, protobuf preferred, one HTTP
// client and one rate limiter shared by all groups, exactly as kubernetes.NewForConfig does) over
// a Scheme of the three groups it serves.
//
// client-go's generated clients satisfy the per-resource interfaces here, so code holding a full
// clientset (the CLI, tests with client-go's fake) passes it through adapt.Clientset.
package kube

import (
	"context"
	"fmt"
	"net/http"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
)

// Interface is the part of the Kubernetes API the node-side code uses.
type Interface interface {
	CoreV1() CoreV1Interface
	ResourceV1() ResourceV1Interface
	CoordinationV1() CoordinationV1Interface
}

// CoreV1Interface is the part of core/v1 the node-side code uses.
type CoreV1Interface interface {
	Nodes() NodeInterface
	Pods(namespace string) PodInterface
	Events(namespace string) EventInterface
	ConfigMaps(namespace string) ConfigMapInterface
}

// ResourceV1Interface is the part of resource.k8s.io/v1 the node-side code uses.
type ResourceV1Interface interface {
	ResourceSlices() ResourceSliceInterface
	ResourceClaims(namespace string) ResourceClaimInterface
	DeviceTaintRules() DeviceTaintRuleInterface
}

// CoordinationV1Interface is the part of coordination.k8s.io/v1 the node-side code uses.
type CoordinationV1Interface interface {
	Leases(namespace string) LeaseInterface
}

// Client is what the node-side code does with one resource. Its methods are client-go's typed
// clients' own, so those satisfy it.
type Client[T runtime.Object, L runtime.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
}

type (
	NodeInterface            = Client[*corev1.Node, *corev1.NodeList]
	PodInterface             = Client[*corev1.Pod, *corev1.PodList]
	EventInterface           = Client[*corev1.Event, *corev1.EventList]
	ConfigMapInterface       = Client[*corev1.ConfigMap, *corev1.ConfigMapList]
	LeaseInterface           = Client[*coordinationv1.Lease, *coordinationv1.LeaseList]
	ResourceSliceInterface   = Client[*resourcev1.ResourceSlice, *resourcev1.ResourceSliceList]
	ResourceClaimInterface   = Client[*resourcev1.ResourceClaim, *resourcev1.ResourceClaimList]
	DeviceTaintRuleInterface = Client[*resourcev1.DeviceTaintRule, *resourcev1.DeviceTaintRuleList]
)

// Scheme holds the types of the groups Interface serves, and the meta types every client needs
// (options, Status, watch events).
var Scheme = runtime.NewScheme()

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(corev1.AddToScheme(Scheme))
	utilruntime.Must(resourcev1.AddToScheme(Scheme))
	utilruntime.Must(coordinationv1.AddToScheme(Scheme))
	utilruntime.Must(gpurecord.AddToScheme(Scheme))
}

// Clientset is Interface over the API server a rest.Config names.
type Clientset struct {
	core         *rest.RESTClient
	resource     *rest.RESTClient
	coordination *rest.RESTClient
}

var _ Interface = (*Clientset)(nil)

// NewForConfig returns a Clientset for c. As with kubernetes.NewForConfig, all groups share one
// HTTP client (one connection) and, when c sets QPS, one rate limiter.
func NewForConfig(c *rest.Config) (*Clientset, error) {
	cfg := *c
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	httpClient, err := rest.HTTPClientFor(&cfg)
	if err != nil {
		return nil, err
	}
	return NewForConfigAndClient(&cfg, httpClient)
}

// NewForConfigAndClient is NewForConfig over an existing HTTP client.
func NewForConfigAndClient(c *rest.Config, httpClient *http.Client) (*Clientset, error) {
	cfg := *c
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		if cfg.Burst <= 0 {
			return nil, fmt.Errorf("burst must be greater than 0 when QPS is set and RateLimiter is not")
		}
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	var cs Clientset
	var err error
	if cs.core, err = groupClient(&cfg, httpClient, "/api", corev1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if cs.resource, err = groupClient(&cfg, httpClient, "/apis", resourcev1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if cs.coordination, err = groupClient(&cfg, httpClient, "/apis", coordinationv1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	return &cs, nil
}

// groupClient is what client-go's generated setConfigDefaults and NewForConfigAndClient do for
// one group version.
func groupClient(c *rest.Config, httpClient *http.Client, apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
	cfg := *c
	cfg.GroupVersion = &gv
	cfg.APIPath = apiPath
	cfg.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, codecs).WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientForConfigAndClient(&cfg, httpClient)
}

func (cs *Clientset) CoreV1() CoreV1Interface                 { return coreV1{cs.core} }
func (cs *Clientset) ResourceV1() ResourceV1Interface         { return resourceV1{cs.resource} }
func (cs *Clientset) CoordinationV1() CoordinationV1Interface { return coordinationV1{cs.coordination} }

// typed is the generated client of one resource: gentype with protobuf preferred, as client-go's.
func typed[T interface {
	runtime.Object
	metav1.Object
}, L runtime.Object](c rest.Interface, resource, namespace string, newObj func() T, newList func() L) Client[T, L] {
	return gentype.NewClientWithList[T, L](resource, c, parameterCodec, namespace, newObj, newList, gentype.PrefersProtobuf[T]())
}

type coreV1 struct{ c rest.Interface }

func (g coreV1) Nodes() NodeInterface {
	return typed(g.c, "nodes", "", func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} })
}

func (g coreV1) Pods(namespace string) PodInterface {
	return typed(g.c, "pods", namespace, func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })
}

func (g coreV1) Events(namespace string) EventInterface {
	return typed(g.c, "events", namespace, func() *corev1.Event { return &corev1.Event{} }, func() *corev1.EventList { return &corev1.EventList{} })
}

func (g coreV1) ConfigMaps(namespace string) ConfigMapInterface {
	return typed(g.c, "configmaps", namespace, func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} })
}

type resourceV1 struct{ c rest.Interface }

func (g resourceV1) ResourceSlices() ResourceSliceInterface {
	return typed(g.c, "resourceslices", "", func() *resourcev1.ResourceSlice { return &resourcev1.ResourceSlice{} }, func() *resourcev1.ResourceSliceList { return &resourcev1.ResourceSliceList{} })
}

func (g resourceV1) ResourceClaims(namespace string) ResourceClaimInterface {
	return typed(g.c, "resourceclaims", namespace, func() *resourcev1.ResourceClaim { return &resourcev1.ResourceClaim{} }, func() *resourcev1.ResourceClaimList { return &resourcev1.ResourceClaimList{} })
}

func (g resourceV1) DeviceTaintRules() DeviceTaintRuleInterface {
	return typed(g.c, "devicetaintrules", "", func() *resourcev1.DeviceTaintRule { return &resourcev1.DeviceTaintRule{} }, func() *resourcev1.DeviceTaintRuleList { return &resourcev1.DeviceTaintRuleList{} })
}

type coordinationV1 struct{ c rest.Interface }

func (g coordinationV1) Leases(namespace string) LeaseInterface {
	return typed(g.c, "leases", namespace, func() *coordinationv1.Lease { return &coordinationv1.Lease{} }, func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} })
}
