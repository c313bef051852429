package watch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
)

// claimCache reads what ties a pod's ResourceClaims to GPUs: informers of the ResourceClaims
// (keeping of each only the devices of driver it is allocated, heldClaim) and of driver's
// ResourceSlices (keeping of each only the GPU of each device, slicedGPUs), started once both
// may be listed.
type claimCache struct {
	client kube.Interface
	driver string
	attrs  dra.Attributes
	// claims and slices are nil until both may be listed and their informers run.
	claims, slices cache.SharedIndexInformer
	// forbidden is true while they may not be listed (logged once each time it becomes so).
	forbidden bool
}

// heldClaim is what the claims' informer keeps of a ResourceClaim: its key and the devices of
// the driver it is allocated (none while it is not).
type heldClaim struct {
	namespace, name string
	devices         []dra.DeviceID
}

// slicedGPUs is what the slices' informer keeps of a ResourceSlice: its key, its pool and
// generation, and the GPU of each device (fleet.SliceGPUs), sorted by device.
type slicedGPUs struct {
	name       string
	pool       string
	generation int64
	devices    []deviceGPU
}

type deviceGPU struct{ device, gpu string }

// Both are runtime.Objects that the informers' stores key by namespace and name.
var (
	_ metav1.ObjectMetaAccessor = (*heldClaim)(nil)
	_ runtime.Object            = (*heldClaim)(nil)
	_ metav1.ObjectMetaAccessor = (*slicedGPUs)(nil)
	_ runtime.Object            = (*slicedGPUs)(nil)
)

func (c *heldClaim) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.namespace, Name: c.name}
}
func (c *heldClaim) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (c *heldClaim) DeepCopyObject() runtime.Object {
	out := *c
	out.devices = slices.Clone(c.devices)
	return &out
}

func (s *slicedGPUs) GetObjectMeta() metav1.Object     { return &metav1.ObjectMeta{Name: s.name} }
func (s *slicedGPUs) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (s *slicedGPUs) DeepCopyObject() runtime.Object {
	out := *s
	out.devices = slices.Clone(s.devices)
	return &out
}

// claimTransform keeps of a ResourceClaim a heldClaim.
func claimTransform(driver string) cache.TransformFunc {
	return func(obj any) (any, error) {
		c, ok := obj.(*resourceapi.ResourceClaim)
		if !ok {
			return obj, nil // a tombstone, or kept already
		}
		return &heldClaim{namespace: c.Namespace, name: c.Name, devices: fleet.ClaimDevices(c, driver)}, nil
	}
}

// sliceTransform keeps of a ResourceSlice a slicedGPUs. The UUIDs are decoded once per device:
// a GPU's MIG partitions share its parent's string.
func sliceTransform(driver string, attrs dra.Attributes) cache.TransformFunc {
	return func(obj any) (any, error) {
		s, ok := obj.(*resourceapi.ResourceSlice)
		if !ok {
			return obj, nil
		}
		out := &slicedGPUs{name: s.Name, pool: s.Spec.Pool.Name, generation: s.Spec.Pool.Generation}
		uuids := map[string]string{}
		for id, gpu := range fleet.SliceGPUs([]*resourceapi.ResourceSlice{s}, driver, attrs) {
			if u, ok := uuids[gpu]; ok {
				gpu = u
			} else {
				uuids[gpu] = gpu
			}
			out.devices = append(out.devices, deviceGPU{device: id.Device, gpu: gpu})
		}
		slices.SortFunc(out.devices, func(a, b deviceGPU) int { return strings.Compare(a.device, b.device) })
		return out, nil
	}
}

// start starts the informers, unless a one-item LIST of either says they may not be listed, and
// returns their HasSynced. They run until ctx is done, in wg.
func (c *claimCache) start(ctx context.Context, wg *sync.WaitGroup) (cache.InformerSynced, error) {
	logger := klog.FromContext(ctx)
	claims := c.client.ResourceV1().ResourceClaims(metav1.NamespaceAll)
	sliceSelector := fields.OneTermEqualSelector("spec.driver", c.driver).String()
	rslices := c.client.ResourceV1().ResourceSlices()
	_, err := claims.List(ctx, metav1.ListOptions{Limit: 1})
	if err == nil {
		_, err = rslices.List(ctx, metav1.ListOptions{FieldSelector: sliceSelector, Limit: 1})
	}
	switch {
	case apierrors.IsForbidden(err):
		if !c.forbidden {
			logger.Info("Warning: judging the fleet without the GPUs pods hold through ResourceClaims: claims or the driver's ResourceSlices may not be listed, so such a job's signature counts as its GPUs' faults; asking again every period",
				"driver", c.driver, "err", err)
		}
		c.forbidden = true
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("list ResourceClaims and ResourceSlices: %w", err)
	}
	if c.forbidden {
		logger.Info("ResourceClaims and ResourceSlices may be listed now: judging with the GPUs pods hold through them again")
		c.forbidden = false
	}
	c.claims = newInformer(c.client, claims, &resourceapi.ResourceClaim{}, "")
	c.slices = newInformer(c.client, rslices, &resourceapi.ResourceSlice{}, sliceSelector)
	if err := errors.Join(c.claims.SetTransform(claimTransform(c.driver)), c.slices.SetTransform(sliceTransform(c.driver, c.attrs))); err != nil {
		return nil, err
	}
	wg.Go(func() { c.claims.RunWithContext(ctx) })
	wg.Go(func() { c.slices.RunWithContext(ctx) })
	return func() bool { return c.claims.HasSynced() && c.slices.HasSynced() }, nil
}

// newInformer is kube.NewInformer without its namespace index: nothing looks objects up by
// namespace, and at hundreds of thousands of claims the index would cost as much as they do.
func newInformer[L runtime.Object](client any, lw kube.ListerWatcher[L], obj runtime.Object, fieldSelector string) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = fieldSelector
			return lw.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = fieldSelector
			return lw.Watch(ctx, opts)
		},
	}, client), obj, 0, cache.Indexers{})
}

// read returns the devices each claim is allocated ("namespace/name") and the GPU each device
// is, from the newest generation of each pool; an error before both informers have listed.
func (c *claimCache) read() (map[string][]dra.DeviceID, map[dra.DeviceID]string, error) {
	if c.claims == nil || !c.claims.HasSynced() || !c.slices.HasSynced() {
		return nil, nil, errors.New("the ResourceClaims and ResourceSlices are not listed yet")
	}
	claims := map[string][]dra.DeviceID{}
	for _, obj := range c.claims.GetStore().List() {
		if h, ok := obj.(*heldClaim); ok && len(h.devices) > 0 {
			claims[h.namespace+"/"+h.name] = h.devices
		}
	}
	var list []*slicedGPUs
	gen := map[string]int64{}
	for _, obj := range c.slices.GetStore().List() {
		if s, ok := obj.(*slicedGPUs); ok {
			list = append(list, s)
			if g, seen := gen[s.pool]; !seen || s.generation > g {
				gen[s.pool] = s.generation
			}
		}
	}
	devices := map[dra.DeviceID]string{}
	for _, s := range list {
		if s.generation != gen[s.pool] {
			continue
		}
		for _, d := range s.devices {
			devices[dra.DeviceID{Pool: s.pool, Device: d.device}] = d.gpu
		}
	}
	return claims, devices, nil
}
