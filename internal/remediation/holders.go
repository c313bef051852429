package remediation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/kube/podresources"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// HolderFinder names the pods that hold a GPU or one of its MIG instances.
type HolderFinder interface {
	Holders(ctx context.Context, dev health.Device, migs []health.Device) ([]string, error)
}

// holds reports whether a device ID the kubelet handed out is the GPU, one of its MIG
// instances, or a time-sliced replica of either ("<uuid>::<n>", as gpuhealth's and NVIDIA's
// device plugins name replicas).
func holds(id string, uuids []string) bool {
	base, _, _ := strings.Cut(id, "::")
	return slices.ContainsFunc(uuids, func(u string) bool { return strings.EqualFold(u, base) })
}

func uuidsOf(dev health.Device, migs []health.Device) []string {
	out := []string{dev.UUID}
	for _, m := range migs {
		out = append(out, m.UUID)
	}
	return out
}

// PodResources asks the kubelet's pod-resources API (List) which pods were allocated the GPU
// through a device plugin.
type PodResources struct {
	// Socket is the kubelet's pod-resources socket.
	Socket string
	// Timeout bounds one List (default podresources.DefaultTimeout).
	Timeout time.Duration
}

var _ HolderFinder = PodResources{}

// Holders implements HolderFinder.
func (p PodResources) Holders(ctx context.Context, dev health.Device, migs []health.Device) ([]string, error) {
	resp, err := podresources.Socket{Path: p.Socket, Timeout: p.Timeout}.List(ctx)
	if err != nil {
		return nil, err
	}
	uuids := uuidsOf(dev, migs)
	var out []string
	for _, pod := range resp.GetPodResources() {
		held := false
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				held = held || slices.ContainsFunc(d.GetDeviceIds(), func(id string) bool { return holds(id, uuids) })
			}
		}
		if held {
			out = append(out, pod.GetNamespace()+"/"+pod.GetName())
		}
	}
	slices.Sort(out)
	return out, nil
}

// Claims finds the pods on the node whose allocated ResourceClaims name one of the GPU's DRA
// devices (its own, its MIG partitions', its passthrough device's: dra.Catalog.Targets).
// It lists the node's pods and reads each of their claims, only while a GPU waits for a reset.
type Claims struct {
	Client   kube.Interface
	NodeName string
	Driver   string
	Devices  Catalogs
}

// Catalogs gives the node's DRA devices as they are now (dradevices.Index does).
type Catalogs interface {
	Catalog(ctx context.Context) (*dra.Catalog, error)
}

var _ HolderFinder = Claims{}

// Holders implements HolderFinder.
func (c Claims) Holders(ctx context.Context, dev health.Device, migs []health.Device) ([]string, error) {
	catalog, err := c.Devices.Catalog(ctx)
	if err != nil {
		return nil, err
	}
	targets := map[dra.DeviceID]bool{}
	for _, d := range append([]health.Device{dev}, migs...) {
		for _, t := range catalog.Targets(d) {
			targets[t.DeviceID] = true
		}
	}
	if len(targets) == 0 {
		return nil, nil
	}
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", c.NodeName).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list the pods on %s: %w", c.NodeName, err)
	}
	var out []string
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != c.NodeName || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue // its containers are gone
		}
		for _, name := range dra.PodClaimNames(pod) {
			claim, err := c.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				// A claim the pod names but that cannot be read may hold the GPU.
				return nil, fmt.Errorf("read ResourceClaim %s/%s of pod %s: %w", pod.Namespace, name, pod.Name, err)
			}
			if a := claim.Status.Allocation; a != nil && slices.ContainsFunc(a.Devices.Results, func(r resourceapi.DeviceRequestAllocationResult) bool {
				return r.Driver == c.Driver && targets[dra.DeviceID{Pool: r.Pool, Device: r.Device}]
			}) {
				out = append(out, fmt.Sprintf("%s/%s (claim %s)", pod.Namespace, pod.Name, name))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// AllHolders asks every finder and returns the union; any finder's error is an error, since a
// holder it would have named may exist.
type AllHolders []HolderFinder

// Holders implements HolderFinder.
func (a AllHolders) Holders(ctx context.Context, dev health.Device, migs []health.Device) ([]string, error) {
	var out []string
	var errs []error
	for _, f := range a {
		h, err := f.Holders(ctx, dev, migs)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, h...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
