package claimstatus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResourcesLister lists what the kubelet allocated to the node's pods (podresources.Socket).
type PodResourcesLister interface {
	List(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error)
}

// NodeGetter returns this node's Node (nodecache.Cache).
type NodeGetter interface {
	Get(ctx context.Context) (*corev1.Node, error)
}

// claimFinder finds the claims of the pods on this node.
type claimFinder interface {
	// claims returns them (an empty map when there are none), an unavailableError when they
	// cannot be found this way, or another error worth a retry.
	claims(ctx context.Context) (map[types.NamespacedName]bool, error)
}

// unavailableError: the node's claims cannot be found, and why, for the operator.
type unavailableError struct{ why string }

func (e unavailableError) Error() string { return e.why }

// FirstKubeletNamingClaims is the first kubelet release whose pod-resources API names each
// container's DRA claims by default: the kubelet's feature gate
// KubeletPodResourcesDynamicResources came in 1.27 as alpha (off), went beta and on by default
// in 1.34, and GA, locked on, in 1.36.
var FirstKubeletNamingClaims = version.MajorMinor(1, 34)

// kubeletClaims finds the node's claims through the kubelet's pod-resources API (List): each
// container's DynamicResources name the claims it was prepared with.
type kubeletClaims struct {
	lister PodResourcesLister
	node   func(ctx context.Context) (*corev1.Node, error)
	// named is set once the kubelet has named a claim: it does, whatever its version says.
	named bool
}

func (k *kubeletClaims) claims(ctx context.Context) (map[types.NamespacedName]bool, error) {
	resp, err := k.lister.List(ctx)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, unavailableError{fmt.Sprintf("the kubelet's pod-resources API is not there (%v): agent.claimStatus.podResourcesSocket must be the kubelet's socket, mounted into the agent's container", err)}
	}
	if err != nil {
		return nil, err
	}
	out := map[types.NamespacedName]bool{}
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDynamicResources() {
				if d.GetClaimName() != "" {
					out[types.NamespacedName{Namespace: cmp.Or(d.GetClaimNamespace(), pod.GetNamespace()), Name: d.GetClaimName()}] = true
				}
			}
		}
	}
	if len(out) > 0 || k.named {
		k.named = true
		return out, nil
	}
	// No claim named: either no pod of the node has one, or the kubelet does not say.
	node, err := k.node(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the kubelet's version: %w", err)
	}
	if v := node.Status.NodeInfo.KubeletVersion; !namesClaims(v) {
		return nil, unavailableError{fmt.Sprintf("the kubelet (%s) names no DRA claims in its pod-resources API unless its feature gate KubeletPodResourcesDynamicResources is on (by default from %d.%d): "+
			"claims holding a GPU of this node that is not Healthy get no %s condition. Upgrade the kubelet, turn the gate on, or set agent.claimStatus.podWatch (it needs cluster-wide pods list/watch)",
			v, FirstKubeletNamingClaims.Major(), FirstKubeletNamingClaims.Minor(), ConditionType)}
	}
	return out, nil
}

// namesClaims tells whether a kubelet of this version names DRA claims in pod-resources by
// default. A version that does not parse (a Node not run by a kubelet) is taken at its word.
func namesClaims(kubeletVersion string) bool {
	v, err := version.ParseGeneric(kubeletVersion)
	if err != nil {
		return true
	}
	return v.Major() > FirstKubeletNamingClaims.Major() ||
		(v.Major() == FirstKubeletNamingClaims.Major() && v.Minor() >= FirstKubeletNamingClaims.Minor())
}
