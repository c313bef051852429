package watch

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
)

func gpuSlice(name, pool string, gen int64, uuids map[string]string) *resourceapi.ResourceSlice {
	node := pool
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceSliceSpec{
		Driver: "gpu.nvidia.com", NodeName: &node, Pool: resourceapi.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: 1}}}
	for dev, uuid := range uuids {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: dev,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: &uuid}}})
	}
	return s
}

func gpuClaim(name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	if results != nil {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	return c
}

// TestClaimCache: the informers keep the allocated devices of the driver and the GPU of each
// device of the newest generation of its pool.
func TestClaimCache(t *testing.T) {
	objs := []runtime.Object{
		gpuSlice("n1", "n1", 2, map[string]string{"gpu-0": "GPU-a", "gpu-1": "GPU-b"}),
		gpuSlice("n1-old", "n1", 1, map[string]string{"gpu-2": "GPU-old"}),
		gpuClaim("two", resourceapi.DeviceRequestAllocationResult{Request: "g", Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0"},
			resourceapi.DeviceRequestAllocationResult{Request: "g", Driver: "nic.example.com", Pool: "n1", Device: "eth0"},
			resourceapi.DeviceRequestAllocationResult{Request: "g", Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-1"}),
		gpuClaim("pending"),
	}
	ctx := t.Context()
	c := &claimCache{client: adapt.Clientset(fake.NewClientset(objs...)), driver: "gpu.nvidia.com", attrs: dra.DefaultAttributes()}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	synced, err := c.start(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		t.Fatal("not synced")
	}
	claims, devices, err := c.read()
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string][]dra.DeviceID{"default/two": {{Pool: "n1", Device: "gpu-0"}, {Pool: "n1", Device: "gpu-1"}}}; !reflect.DeepEqual(claims, want) {
		t.Errorf("claims = %v, want %v", claims, want)
	}
	if want := map[dra.DeviceID]string{{Pool: "n1", Device: "gpu-0"}: "GPU-a", {Pool: "n1", Device: "gpu-1"}: "GPU-b"}; !reflect.DeepEqual(devices, want) {
		t.Errorf("devices = %v, want %v", devices, want)
	}
}

// TestClaimCacheForbidden: claims that may not be listed are logged once, and asked for again.
func TestClaimCacheForbidden(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
	defer cancel()
	client := fake.NewClientset()
	client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(resourceapi.Resource("resourceclaims"), "", errors.New("no claims for you"))
	})
	c := &claimCache{client: adapt.Clientset(client), driver: "gpu.nvidia.com", attrs: dra.DefaultAttributes()}
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 3 {
		if _, err := c.start(ctx, &wg); !apierrors.IsForbidden(err) {
			t.Fatalf("start: %v, want Forbidden", err)
		}
	}
	if _, _, err := c.read(); err == nil {
		t.Error("read before the claims are listed: no error")
	}
	buf := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if n := strings.Count(buf, "without the GPUs pods hold through ResourceClaims"); n != 1 {
		t.Errorf("the warning was logged %d times, want once:\n%s", n, buf)
	}
}
