package devicetaint_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

type attrs = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute

func str(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(s)}
}

func nodeSlice(name string, devs ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{Driver: config.DefaultDriverName, NodeName: ptr.To("n1"),
			Pool: resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1}, Devices: devs},
	}
}

func device(name string, a attrs) resourceapi.Device {
	return resourceapi.Device{Name: name, Attributes: a}
}

const (
	busA = "0000:1b:00.0"
	busB = "0000:43:00.0"
)

var (
	gpuA  = health.Device{UUID: "GPU-a", PCIBusID: "00000000:1B:00.0"}
	gpuB  = health.Device{UUID: "GPU-b", Index: 1, PCIBusID: "00000000:43:00.0"}
	migA1 = health.Device{UUID: "MIG-a1", PCIBusID: "00000000:1B:00.0", MIG: &health.MIGPlacement{ParentUUID: "GPU-a", GPUInstance: 1}}

	gpuDev = func(name, uuid, bus string) resourceapi.Device {
		return device(name, attrs{"type": str("gpu"), "uuid": str(uuid), "resource.kubernetes.io/pciBusID": str(bus)})
	}
	migDev = func(name, uuid, parent, bus string) resourceapi.Device {
		a := attrs{"type": str("mig"), "parentUUID": str(parent), "resource.kubernetes.io/pciBusID": str(bus)}
		if uuid != "" {
			a["uuid"] = str(uuid)
		}
		return device(name, a)
	}
	vfioDev = func(name, uuid, bus string) resourceapi.Device {
		return device(name, attrs{"type": str("vfio"), "uuid": str(uuid), "resource.kubernetes.io/pciBusID": str(bus)})
	}
)

// countingBreaker admits everything and counts the questions.
type countingBreaker struct{ asked map[string]int }

func (b *countingBreaker) Admit(_ context.Context, uuid string) (bool, error) {
	b.asked[uuid]++
	return true, nil
}
func (b *countingBreaker) SetHeld([]string) bool { return false }

// TestSyncTaintsEveryDeviceTheDriverPublishesForASickGPU: one rule per DRA device the fault
// reaches, named after the GPU (and the device when it is not the GPU's own), and an unchanged
// state never writes again.
func TestSyncTaintsEveryDeviceTheDriverPublishesForASickGPU(t *testing.T) {
	sick := func(d health.Device, code uint32) health.DeviceStatus {
		return status(d.UUID, d.Index, health.Unhealthy, false, health.Condition{Type: health.ConditionXID, Code: code, Severity: health.Unhealthy, Reason: "XID"})
	}
	withDevice := func(s health.DeviceStatus, d health.Device) health.DeviceStatus { s.Device = d; return s }
	base := func(uuid string) string { return devicetaint.RuleName("n1", uuid) }
	for _, tc := range []struct {
		name      string
		slices    []*resourceapi.ResourceSlice
		snap      []health.DeviceStatus
		want      map[string]string // rule name -> device
		unmatched []string
	}{
		{"whole GPUs named by minor", []*resourceapi.ResourceSlice{nodeSlice("s", gpuDev("gpu-7", "GPU-a", busA), gpuDev("gpu-0", "GPU-b", busB))},
			[]health.DeviceStatus{withDevice(sick(gpuA, 79), gpuA), withDevice(status("GPU-b", 1, health.Healthy, false), gpuB)},
			map[string]string{base("GPU-a"): "gpu-7"}, nil},
		{"dynamic MIG in split slices: the full GPU and its partitions", []*resourceapi.ResourceSlice{
			nodeSlice("n1-counters"),
			nodeSlice("n1-gpu-a", gpuDev("gpu-7", "GPU-a", busA), migDev("gpu-7-mig-1g10gb-19-0", "", "GPU-a", busA), migDev("gpu-7-mig-7g80gb-0-0", "", "GPU-a", busA)),
			nodeSlice("n1-gpu-b", gpuDev("gpu-0", "GPU-b", busB), migDev("gpu-0-mig-1g10gb-19-0", "", "GPU-b", busB))},
			[]health.DeviceStatus{withDevice(sick(gpuA, 79), gpuA), withDevice(status("GPU-b", 1, health.Healthy, false), gpuB)},
			map[string]string{base("GPU-a"): "gpu-7", base("GPU-a") + "-gpu-7-mig-1g10gb-19-0": "gpu-7-mig-1g10gb-19-0", base("GPU-a") + "-gpu-7-mig-7g80gb-0-0": "gpu-7-mig-7g80gb-0-0"}, nil},
		{"dynamic MIG: a fault of one live MIG instance has no partition to taint", []*resourceapi.ResourceSlice{
			nodeSlice("n1-gpu-a", gpuDev("gpu-7", "GPU-a", busA), migDev("gpu-7-mig-1g10gb-19-0", "", "GPU-a", busA))},
			[]health.DeviceStatus{withDevice(status("GPU-a", 0, health.Healthy, false), gpuA), withDevice(sick(migA1, 95), migA1)},
			map[string]string{}, []string{"MIG-a1"}},
		{"static MIG: a MIG fault taints its own device only", []*resourceapi.ResourceSlice{
			nodeSlice("s", migDev("gpu-7-mig-1g10gb-19-0", "MIG-a1", "GPU-a", busA), migDev("gpu-7-mig-1g10gb-19-1", "MIG-a2", "GPU-a", busA))},
			[]health.DeviceStatus{withDevice(status("GPU-a", 0, health.Healthy, false), gpuA), withDevice(sick(migA1, 95), migA1)},
			map[string]string{base("MIG-a1"): "gpu-7-mig-1g10gb-19-0"}, nil},
		{"passthrough: the GPU and its VFIO device", []*resourceapi.ResourceSlice{nodeSlice("s",
			gpuDev("gpu-7", "GPU-a", busA), vfioDev("gpu-vfio-0", "0b3f5c6e-aaaa", busA), gpuDev("gpu-0", "GPU-b", busB), vfioDev("gpu-vfio-1", "0b3f5c6e-bbbb", busB))},
			[]health.DeviceStatus{withDevice(sick(gpuA, 79), gpuA), withDevice(status("GPU-b", 1, health.Healthy, false), gpuB)},
			map[string]string{base("GPU-a"): "gpu-7", base("GPU-a") + "-gpu-vfio-0": "gpu-vfio-0"}, nil},
		{"bad slices: what can be matched is, nothing loops", []*resourceapi.ResourceSlice{
			nodeSlice("s1", gpuDev("gpu-7", "GPU-a", busA), device("gpu-x", attrs{"uuid": {IntValue: ptr.To[int64](1)}}),
				device("gpu-y", nil), vfioDev("gpu-vfio-0", "0b3f5c6e-aaaa", "not-an-address")),
			nodeSlice("s2", gpuDev("gpu-7", "GPU-z", busB), gpuDev("gpu-8", "GPU-a", busA))},
			[]health.DeviceStatus{withDevice(sick(gpuA, 79), gpuA)},
			map[string]string{base("GPU-a"): "gpu-7", base("GPU-a") + "-gpu-8": "gpu-8"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-n1"}}}
			for _, s := range tc.slices {
				objs = append(objs, s)
			}
			client := fake.NewClientset(objs...)
			var unmatched []string
			cb := &countingBreaker{asked: map[string]int{}}
			s := devicetaint.New(adapt.Clientset(client), "n1", devicetaint.Options{Breaker: cb, Unmatched: func(d health.DeviceStatus) { unmatched = append(unmatched, d.Device.UUID) }})
			start(t, s)
			snap := health.Snapshot{Devices: tc.snap}
			if _, err := s.Sync(t.Context(), snap); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if n, err := s.Sync(t.Context(), snap); err != nil || n != 0 {
					t.Fatalf("Sync %d of an unchanged state = %d writes, %v; want 0 writes", i+2, n, err)
				}
			}
			list, err := client.ResourceV1().DeviceTaintRules().List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, r := range list.Items {
				got[r.Name] = *r.Spec.DeviceSelector.Device
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("rules = %v, want %v", got, tc.want)
			}
			if !slices.Equal(unmatched, tc.unmatched) {
				t.Errorf("unmatched = %v, want %v (once)", unmatched, tc.unmatched)
			}
			for uuid, n := range cb.asked {
				if n != 1 {
					t.Errorf("the breaker was asked %d times about %s, want once", n, uuid)
				}
			}
		})
	}
}

// TestRulesFollowTheDriverRepublishing: a driver that restarts republishes its slices (here:
// DynamicMIG turned on); the rules follow the devices without an error.
func TestRulesFollowTheDriverRepublishing(t *testing.T) {
	ctx := t.Context()
	before := nodeSlice("s", gpuDev("gpu-7", "GPU-a", busA))
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-n1"}}, before)
	s := devicetaint.New(adapt.Clientset(client), "n1", devicetaint.Options{})
	triggered := start(t, s)
	snap := health.Snapshot{Devices: []health.DeviceStatus{status("GPU-a", 0, health.Unhealthy, false, xid79)}}
	if n, err := s.Sync(ctx, snap); err != nil || n != 1 {
		t.Fatalf("Sync = %d, %v; want one rule", n, err)
	}
	after := nodeSlice("s", gpuDev("gpu-7", "GPU-a", busA), migDev("gpu-7-mig-1g10gb-19-0", "", "GPU-a", busA))
	after.Spec.Pool.Generation = 1
	if _, err := client.ResourceV1().ResourceSlices().Update(ctx, after, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Sync whenever the syncer asks for it, as the Writer does, until the cache has the new slice.
	for {
		select {
		case <-triggered:
		case <-time.After(30 * time.Second): // only reached when the cache never sees the update
			t.Fatal("no rule for the new partition")
		}
		if _, err := s.Sync(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if _, err := client.ResourceV1().DeviceTaintRules().Get(ctx, devicetaint.RuleName("n1", "GPU-a")+"-gpu-7-mig-1g10gb-19-0", metav1.GetOptions{}); err == nil {
			return
		}
	}
}

func TestStartRefusesMalformedAttributeNames(t *testing.T) {
	s := devicetaint.New(adapt.Clientset(fake.NewClientset()), "n1", devicetaint.Options{PCIBusIDAttribute: "pci bus id"})
	err := s.Start(t.Context(), func() {})
	if err == nil || !strings.Contains(err.Error(), "pciBusIDAttribute") || !strings.Contains(err.Error(), "C identifier") {
		t.Fatalf("Start = %v, want an error naming pciBusIDAttribute", err)
	}
}
