package dradevices_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

type attrs = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute

func slice(name, node, driver string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}, Devices: devices},
	}
}

func dev(name string, a attrs) resourceapi.Device {
	return resourceapi.Device{Name: name, Attributes: a}
}

func str(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(s)}
}

func TestIndexFindsGPUsByBareAndQualifiedUUIDs(t *testing.T) {
	client := fake.NewClientset(
		slice("a", "n1", "gpu.nvidia.com",
			dev("gpu-0", attrs{"uuid": str("GPU-A")}),
			dev("gpu-1", attrs{"gpu.nvidia.com/uuid": str("GPU-B")}),
		),
		slice("b", "n2", "gpu.nvidia.com", dev("gpu-0", attrs{"uuid": str("GPU-C")})),
		slice("c", "n1", "other.driver", dev("gpu-0", attrs{"uuid": str("GPU-D")})),
	)
	ix := dradevices.New(adapt.Clientset(client), "n1", "gpu.nvidia.com", "uuid")
	if err := ix.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	c, err := ix.Catalog(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for uuid, want := range map[string]string{"GPU-A": "gpu-0", "gpu-b": "gpu-1", "GPU-C": "", "GPU-D": ""} {
		got := c.Targets(health.Device{UUID: uuid})
		if want == "" && len(got) != 0 || want != "" && (len(got) != 1 || got[0] != dradevices.Target{Device: dradevices.Device{Pool: "n1", Name: want}, Own: true}) {
			t.Errorf("Targets(%s) = %v, want %q of n1's gpu.nvidia.com slice only", uuid, got, want)
		}
	}
	if !c.Known(dradevices.Device{Pool: "n1", Name: "gpu-1"}) || c.Known(dradevices.Device{Pool: "n2", Name: "gpu-0"}) {
		t.Error("Known is wrong about n1/gpu-1 or n2/gpu-0")
	}
}

// TestEachProblemIsLoggedOnceWhileItLasts: every Sync of every reporter reads a catalog; a
// broken slice must not flood the log, yet a problem that goes away and comes back is logged
// again.
func TestEachProblemIsLoggedOnceWhileItLasts(t *testing.T) {
	var lines []string
	ctx := klog.NewContext(context.Background(), funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{}))
	broken := slice("a", "n1", "gpu.nvidia.com", dev("gpu-0", attrs{"uuid": {IntValue: ptr.To[int64](3)}}))
	client := fake.NewClientset(broken)
	ix := dradevices.New(adapt.Clientset(client), "n1", "gpu.nvidia.com", "uuid")
	if err := ix.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := ix.Catalog(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "is not a string") || !strings.Contains(lines[0], `"device"="gpu-0"`) {
		t.Fatalf("log = %q, want one line naming gpu-0 and the problem", lines)
	}

	fixed := broken.DeepCopy()
	fixed.Spec.Devices[0].Attributes["uuid"] = str("GPU-A")
	if _, err := client.ResourceV1().ResourceSlices().Update(t.Context(), fixed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pollCatalog(ctx, t, ix, true)
	if _, err := client.ResourceV1().ResourceSlices().Update(t.Context(), broken, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pollCatalog(ctx, t, ix, false)
	if len(lines) != 2 {
		t.Errorf("log = %q, want the problem logged again after it came back", lines)
	}
}

// pollCatalog waits until the index's cache has GPU-A matched (or not).
func pollCatalog(ctx context.Context, t *testing.T, ix *dradevices.Index, matched bool) {
	t.Helper()
	for range 500 {
		c, err := ix.Catalog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if (len(c.Targets(health.Device{UUID: "GPU-A"})) > 0) == matched {
			return
		}
		select {
		case <-t.Context().Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("the cache never saw GPU-A matched=%v", matched)
}

func TestAttachChecksTheAttributes(t *testing.T) {
	client := fake.NewClientset()
	shared := dradevices.New(adapt.Clientset(client), "n1", "gpu.nvidia.com", "uuid")
	for _, tc := range []struct {
		name  string
		ix    *dradevices.Index
		attrs dradevices.Attributes
		err   string
	}{
		{"defaults fill empty names", shared, dradevices.Attributes{}, ""},
		{"a malformed name", nil, dradevices.Attributes{ParentUUID: "parent uuid"}, "parentUUIDAttribute"},
		{"the shared index matches by other names", shared, dradevices.Attributes{PCIBusID: "example.com/bus"}, "shared device index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dradevices.Attach(t.Context(), tc.ix, adapt.Clientset(client), "n1", "gpu.nvidia.com", tc.attrs, func() {})
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Attach = %v, want error containing %q", err, tc.err)
			}
		})
	}
}
