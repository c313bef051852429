// Package adapt passes a client-go clientset (the CLI's, or client-go's fake in tests) where the
// node-side code takes a kube.Interface. It is kept apart from package kube so that the agent,
// which builds kube.Clientset itself, does not link client-go's clientset.
package adapt

import (
	"k8s.io/client-go/kubernetes"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	resourcev1 "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/client-go/util/watchlist"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// Clientset returns cs as a kube.Interface.
func Clientset(cs kubernetes.Interface) kube.Interface { return clientset{cs} }

type clientset struct{ cs kubernetes.Interface }

func (c clientset) CoreV1() kube.CoreV1Interface         { return core{c.cs.CoreV1()} }
func (c clientset) ResourceV1() kube.ResourceV1Interface { return resource{c.cs.ResourceV1()} }
func (c clientset) CoordinationV1() kube.CoordinationV1Interface {
	return coordination{c.cs.CoordinationV1()}
}

// IsWatchListSemanticsUnSupported passes on what cs says: client-go's fake cannot serve the
// streaming lists informers otherwise ask for.
func (c clientset) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(c.cs)
}

type core struct{ c corev1.CoreV1Interface }

func (g core) Nodes() kube.NodeInterface                           { return g.c.Nodes() }
func (g core) Pods(namespace string) kube.PodInterface             { return g.c.Pods(namespace) }
func (g core) Events(namespace string) kube.EventInterface         { return g.c.Events(namespace) }
func (g core) ConfigMaps(namespace string) kube.ConfigMapInterface { return g.c.ConfigMaps(namespace) }

type resource struct {
	c resourcev1.ResourceV1Interface
}

func (g resource) ResourceSlices() kube.ResourceSliceInterface { return g.c.ResourceSlices() }
func (g resource) ResourceClaims(namespace string) kube.ResourceClaimInterface {
	return g.c.ResourceClaims(namespace)
}
func (g resource) DeviceTaintRules() kube.DeviceTaintRuleInterface { return g.c.DeviceTaintRules() }

type coordination struct {
	c coordinationv1.CoordinationV1Interface
}

func (g coordination) Leases(namespace string) kube.LeaseInterface { return g.c.Leases(namespace) }
