package evict

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// How a pod holds a GPU.
const (
	ViaDevicePlugin = "device-plugin"
	ViaVolcano      = "volcano"
)

// Holder is a pod that holds the GPU.
type Holder struct {
	Namespace, Name string
	Via             string
}

func (h Holder) String() string { return h.Namespace + "/" + h.Name }

// Found is what a Finder learnt: the holders, and warnings about pods it could not place (never
// guessed: a pod it cannot match is left alone).
type Found struct {
	Holders  []Holder
	Warnings []string
}

// Finder names the pods holding a GPU or one of its MIG instances. An error means "do not
// know": nothing of that GPU is evicted.
type Finder interface {
	Find(ctx context.Context, gpu health.Device, migs []health.Device) (Found, error)
}

// PodLister lists the kubelet's pod resources (podresourcesv1's List); PodResources dials the
// kubelet's socket for one.
type PodLister interface {
	List(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error)
}

// PodResources finds device-plugin pods through the kubelet's pod-resources API. Device IDs are
// GPU or MIG UUIDs ("GPU-...", "MIG-...", a time-sliced replica "<uuid>::<n>"), as with the
// device plugins' default uuid strategy. Under the index strategy an ID is the GPU's index ("3",
// "3:1" for a MIG instance of GPU 3): such a pod is matched by index, with a warning since an
// index can shift, when the whole GPU asks for eviction; when only one of its MIG instances does,
// an index cannot tell which instance the pod holds, and the pod is left alone with a warning, as
// is one whose ID is neither.
type PodResources struct {
	Lister PodLister
	// ResourcePrefix names the resources whose IDs may be indexes (default "nvidia.com/"); IDs
	// of other resources are matched by UUID only.
	ResourcePrefix string
}

var _ Finder = PodResources{}

// Find implements Finder.
func (p PodResources) Find(ctx context.Context, gpu health.Device, migs []health.Device) (Found, error) {
	resp, err := p.Lister.List(ctx)
	if err != nil {
		return Found{}, err
	}
	prefix := p.ResourcePrefix
	if prefix == "" {
		prefix = "nvidia.com/"
	}
	uuids := []string{gpu.UUID}
	for _, m := range migs {
		uuids = append(uuids, m.UUID)
	}
	var f Found
	for _, pod := range resp.GetPodResources() {
		held := false
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					m, warning := matchID(id, d.GetResourceName(), prefix, gpu, uuids)
					held = held || m
					if warning != "" {
						f.Warnings = append(f.Warnings, fmt.Sprintf("pod %s/%s: %s", pod.GetNamespace(), pod.GetName(), warning))
					}
				}
			}
		}
		if held {
			f.Holders = append(f.Holders, Holder{Namespace: pod.GetNamespace(), Name: pod.GetName(), Via: ViaDevicePlugin})
		}
	}
	f.Warnings = slices.Compact(f.Warnings)
	return f, nil
}

// matchID reports whether a device ID names the GPU (or one of its MIG instances), and a
// warning when it names it by index or cannot be read.
func matchID(id, resource, prefix string, gpu health.Device, uuids []string) (bool, string) {
	base, _, _ := strings.Cut(id, "::")
	if isUUID(base) {
		return slices.ContainsFunc(uuids, func(u string) bool { return strings.EqualFold(u, base) }), ""
	}
	if !strings.HasPrefix(resource, prefix) {
		return false, "" // another device plugin's IDs: none of ours
	}
	gpuPart, _, _ := strings.Cut(base, ":")
	n, err := strconv.Atoi(gpuPart)
	if err != nil || n < 0 || n >= gpuhealthv1.MaxGPUsPerNode {
		return false, fmt.Sprintf("%s device ID %q is neither a UUID nor an index; left alone", resource, short(id))
	}
	if n != gpu.Index {
		return false, ""
	}
	if gpu.MIG != nil {
		// Only this MIG instance asks, not its GPU: an index names the GPU and the plugin's own
		// count of its instances, which says nothing of which instance this one is.
		return false, fmt.Sprintf("%s device ID %q is an index on GPU %d, whose MIG instance %s asks for eviction: which instance it names is unknown; left alone", resource, short(id), gpu.Index, gpu.UUID)
	}
	if gpu.Index < 0 || gpu.Missing {
		return false, fmt.Sprintf("%s device ID %q is an index and GPU %s has none; left alone", resource, short(id), gpu.UUID)
	}
	return true, fmt.Sprintf("%s device ID %q is an index (deviceIDStrategy index): matched to GPU %d (%s) by index", resource, short(id), gpu.Index, gpu.UUID)
}

func isUUID(id string) bool {
	u := strings.ToUpper(id)
	return strings.HasPrefix(u, "GPU-") || strings.HasPrefix(u, "MIG-")
}

// short bounds a value quoted in a warning.
func short(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Volcano finds Volcano GPU-sharing pods on the node by their card: gpuhealth.dev/gpu-uuid when
// set (it survives index shifts), else volcano.sh/gpu-index. A pod whose index cannot be read
// is left alone with a warning.
type Volcano struct {
	Client   kube.Interface
	NodeName string
}

var _ Finder = Volcano{}

// Find implements Finder. MIG instances are not shared through Volcano: only the GPU counts,
// and a MIG instance that asks for eviction alone (its GPU does not) has no Volcano pods.
func (v Volcano) Find(ctx context.Context, gpu health.Device, _ []health.Device) (Found, error) {
	if gpu.MIG != nil {
		return Found{}, nil
	}
	pods, err := v.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", v.NodeName).String(),
	})
	if err != nil {
		return Found{}, fmt.Errorf("list the pods on %s: %w", v.NodeName, err)
	}
	var f Found
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != v.NodeName || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		held, warning := volcanoHolds(pod, gpu)
		if warning != "" {
			f.Warnings = append(f.Warnings, fmt.Sprintf("pod %s/%s: %s", pod.Namespace, pod.Name, warning))
		}
		if held {
			f.Holders = append(f.Holders, Holder{Namespace: pod.Namespace, Name: pod.Name, Via: ViaVolcano})
		}
	}
	return f, nil
}

func volcanoHolds(pod *corev1.Pod, gpu health.Device) (bool, string) {
	if u := pod.Annotations[gpuhealthv1.PodGPUUUIDKey]; u != "" {
		return strings.EqualFold(u, gpu.UUID), ""
	}
	cards, present, ok := gpuhealthv1.ReadPodCards(pod.Annotations)
	switch {
	case !present:
		return false, ""
	case !ok:
		return false, fmt.Sprintf("%s %q is not a card index; left alone", gpuhealthv1.PodGPUIndexKey, short(pod.Annotations[gpuhealthv1.PodGPUIndexKey]))
	}
	held := slices.Contains(cards, gpu.Index)
	if held && (gpu.Index < 0 || gpu.Missing) {
		return false, ""
	}
	return held, ""
}

// find asks every finder; any error is "do not know".
func (e *Evictor) find(ctx context.Context, t target) ([]Holder, error) {
	var out []Holder
	for _, f := range e.opts.Finders {
		found, err := f.Find(ctx, t.gpu, t.migs)
		if err != nil {
			return nil, err
		}
		for _, w := range found.Warnings {
			e.noticeNode(corev1.EventTypeWarning, "GPUEvictionPodWarning", fmt.Sprintf("GPU %d (%s) asks for eviction: %s", t.gpu.Index, t.gpu.UUID, w))
		}
		out = append(out, found.Holders...)
	}
	slices.SortFunc(out, func(a, b Holder) int {
		if c := compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return compare(a.Name, b.Name)
	})
	return slices.CompactFunc(out, func(a, b Holder) bool { return a.Namespace == b.Namespace && a.Name == b.Name }), nil
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
