package dradevices_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/dra/dratest"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestIndexFindsGPUsByBareAndQualifiedUUIDs(t *testing.T) {
	client := fake.NewClientset(
		dratest.Slice("a", "n1", "gpu.nvidia.com",
			dratest.Device("gpu-0", dratest.Attrs{"uuid": dratest.String("GPU-A")}),
			dratest.Device("gpu-1", dratest.Attrs{"gpu.nvidia.com/uuid": dratest.String("GPU-B")}),
		),
		dratest.Slice("b", "n2", "gpu.nvidia.com", dratest.Device("gpu-0", dratest.Attrs{"uuid": dratest.String("GPU-C")})),
		dratest.Slice("c", "n1", "other.driver", dratest.Device("gpu-0", dratest.Attrs{"uuid": dratest.String("GPU-D")})),
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
		if want == "" && len(got) != 0 || want != "" && (len(got) != 1 || got[0] != dra.Target{DeviceID: dra.DeviceID{Pool: "n1", Device: want}, Own: true}) {
			t.Errorf("Targets(%s) = %v, want %q of n1's gpu.nvidia.com slice only", uuid, got, want)
		}
	}
	if !c.Known(dra.DeviceID{Pool: "n1", Device: "gpu-1"}) || c.Known(dra.DeviceID{Pool: "n2", Device: "gpu-0"}) {
		t.Error("Known is wrong about n1/gpu-1 or n2/gpu-0")
	}
}

// TestEachProblemIsLoggedOnceWhileItLasts: every Sync of every reporter reads a catalog; a
// broken slice must not flood the log, yet a problem that goes away and comes back is logged
// again.
func TestEachProblemIsLoggedOnceWhileItLasts(t *testing.T) {
	var log healthtest.Log
	ctx := log.Context()
	broken := dratest.Slice("a", "n1", "gpu.nvidia.com", dratest.Device("gpu-0", dratest.Attrs{"uuid": {IntValue: ptr.To[int64](3)}}))
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
	if lines := log.Lines(); len(lines) != 1 || !strings.Contains(lines[0], "is not a string") || !strings.Contains(lines[0], `"device"="gpu-0"`) {
		t.Fatalf("log = %q, want one line naming gpu-0 and the problem", lines)
	}

	fixed := broken.DeepCopy()
	fixed.Spec.Devices[0].Attributes["uuid"] = dratest.String("GPU-A")
	if _, err := client.ResourceV1().ResourceSlices().Update(t.Context(), fixed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pollCatalog(ctx, t, ix, true)
	if _, err := client.ResourceV1().ResourceSlices().Update(t.Context(), broken, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pollCatalog(ctx, t, ix, false)
	if lines := log.Lines(); len(lines) != 2 {
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
		attrs dra.Attributes
		err   string
	}{
		{"defaults fill empty names", shared, dra.Attributes{}, ""},
		{"a malformed name", nil, dra.Attributes{ParentUUID: "parent uuid"}, "parentUUIDAttribute"},
		{"the shared index matches by other names", shared, dra.Attributes{PCIBusID: "example.com/bus"}, "shared device index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dradevices.Attach(t.Context(), tc.ix, dradevices.Source{Client: adapt.Clientset(client), Node: "n1", Driver: "gpu.nvidia.com", Attributes: tc.attrs}, func() {})
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Attach = %v, want error containing %q", err, tc.err)
			}
		})
	}
}
