package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func testScenario(t *testing.T) *sim.Scenario {
	t.Helper()
	sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: node-a\ngpus: {count: 2, migInstances: {\"1\": 2}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestDevices pins the slice's shape: whole GPUs named gpu-<minor> with NVIDIA's attributes, no
// MIG instances.
func TestDevices(t *testing.T) {
	inv := newInventory(testScenario(t).Devices(), "node-a")
	devs := inv.devices()
	if len(devs) != 2 {
		t.Fatalf("%d devices, want the 2 whole GPUs", len(devs))
	}
	for i, d := range devs {
		if want := fmt.Sprintf("gpu-%d", i); d.Name != want {
			t.Errorf("device %d is %q, want %q", i, d.Name, want)
		}
		a := d.Attributes
		if got := *a["uuid"].StringValue; got != sim.GPUUUID("node-a", i) {
			t.Errorf("%s: uuid %q", d.Name, got)
		}
		if got := *a["index"].IntValue; got != int64(i) {
			t.Errorf("%s: index %d", d.Name, got)
		}
		if *a["type"].StringValue != "gpu" || *a["productName"].StringValue != sim.DefaultModel {
			t.Errorf("%s: type %q productName %q", d.Name, *a["type"].StringValue, *a["productName"].StringValue)
		}
		if got, want := *a["resource.kubernetes.io/pciBusID"].StringValue, fmt.Sprintf("0000:%02x:00.0", 0x10+i); got != want {
			t.Errorf("%s: pciBusID %q", d.Name, got)
		}
	}
	if got := inv.deviceIDs()[sim.GPUUUID("node-a", 1)]; got != (dra.DeviceID{Pool: "node-a", Device: "gpu-1"}) {
		t.Errorf("health stream ID of GPU 1: %+v", got)
	}
}

type fakePublisher chan resourceslice.DriverResources

func (f fakePublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	f <- r
	return nil
}

// TestPublishSlices checks that the slice is published at once, republished with a taint on the
// sick GPU's device, and again without it once the GPU is reset.
func TestPublishSlices(t *testing.T) {
	sc := testScenario(t)
	tracker, err := health.NewTracker(health.DefaultPolicy(), sc.Devices())
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tracker)
	inv := newInventory(sc.Devices(), "node-a")
	pub := make(fakePublisher, 10)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- publishSlices(ctx, m, pub, inv, dra.TaintOptions{}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	next := func() []resourceapi.Device {
		t.Helper()
		select {
		case r := <-pub:
			return r.Pools["node-a"].Slices[0].Devices
		case <-time.After(10 * time.Second):
			t.Fatal("nothing published")
			return nil
		}
	}
	taints := func(devs []resourceapi.Device) map[string][]resourceapi.DeviceTaint {
		out := map[string][]resourceapi.DeviceTaint{}
		for _, d := range devs {
			if len(d.Taints) > 0 {
				out[d.Name] = d.Taints
			}
		}
		return out
	}

	if got := taints(next()); len(got) != 0 {
		t.Fatalf("first publish has taints %v", got)
	}
	uuid := sim.GPUUUID("node-a", 1)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m.Signal(health.XIDSignal(uuid, 48, at))
	got := taints(next())
	if ts := got["gpu-1"]; len(got) != 1 || len(ts) != 1 || ts[0].Key != dra.TaintKeyPrefix+"xid" || ts[0].Value != "48" ||
		ts[0].Effect != resourceapi.DeviceTaintEffectNoSchedule || !ts[0].TimeAdded.Time.Equal(at) {
		t.Fatalf("after XID 48 on GPU 1: taints %v, want gpuhealth.dev/xid=48:NoSchedule on gpu-1 only", got)
	}
	m.Signal(health.Signal{Kind: health.SignalReset, Device: uuid, Time: at.Add(time.Minute)})
	if got := taints(next()); len(got) != 0 {
		t.Fatalf("after the reset: taints %v, want none", got)
	}
	select {
	case r := <-pub:
		t.Errorf("published again without a change: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestPrepareAndUnprepare checks the CDI spec a claim gets and that unprepare removes it, also
// when it runs twice.
func TestPrepareAndUnprepare(t *testing.T) {
	dir := t.TempDir()
	inv := newInventory(testScenario(t).Devices(), "node-a")
	d := &driver{name: DefaultDriverName, inventory: inv, cdi: cdiWriter{dir: dir, vendor: cdiVendor(DefaultDriverName)}}
	claim := &resourceapi.ResourceClaim{}
	claim.Namespace, claim.Name, claim.UID = "ns", "train", types.UID("1234")
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: DefaultDriverName, Pool: "node-a", Device: "gpu-1"},
		{Request: "nic", Driver: "nic.example.com", Pool: "node-a", Device: "eth0"},
	}}}
	res, err := d.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	r := res[claim.UID]
	want := kubeletplugin.Device{Requests: []string{"gpu"}, PoolName: "node-a", DeviceName: "gpu-1",
		CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/device=1234-gpu-1"}}
	if r.Err != nil || len(r.Devices) != 1 || r.Devices[0].DeviceName != want.DeviceName || r.Devices[0].CDIDeviceIDs[0] != want.CDIDeviceIDs[0] {
		t.Fatalf("prepare: %+v, want %+v", r, want)
	}
	path := filepath.Join(dir, "k8s.gpu.nvidia.com-device_1234.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if err := cdispec.ValidateVersion(&spec); err != nil {
		t.Error(err)
	}
	uuid := sim.GPUUUID("node-a", 1)
	if spec.Kind != "k8s.gpu.nvidia.com/device" || len(spec.Devices) != 1 || spec.Devices[0].Name != "1234-gpu-1" ||
		strings.Join(spec.ContainerEdits.Env, " ") != "NVIDIA_VISIBLE_DEVICES="+uuid {
		t.Errorf("CDI spec:\n%s", b)
	}

	// A device of another pool is refused.
	claim.Status.Allocation.Devices.Results[0].Pool = "node-b"
	res, _ = d.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{claim})
	if res[claim.UID].Err == nil {
		t.Error("prepared a device of another node")
	}

	obj := kubeletplugin.NamespacedObject{UID: claim.UID}
	for range 2 {
		errs, err := d.UnprepareResourceClaims(t.Context(), []kubeletplugin.NamespacedObject{obj})
		if err != nil || errs[claim.UID] != nil {
			t.Fatalf("unprepare: %v %v", err, errs)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the CDI spec is still there: %v", err)
	}
}

// TestOnlyPublicPackages holds the example to its point: it uses gpuhealth's public packages
// (pkg/...) and nothing internal, which Go would allow here (the module path is under the
// repository's).
func TestOnlyPublicPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/gpuhealth/gpuhealth/") && !strings.HasPrefix(dep, "github.com/gpuhealth/gpuhealth/pkg/") &&
			!strings.HasPrefix(dep, "github.com/gpuhealth/gpuhealth/examples/") {
			t.Errorf("the example depends on %s: only github.com/gpuhealth/gpuhealth/pkg/... is public", dep)
		}
	}
}
