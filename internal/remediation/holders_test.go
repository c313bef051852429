package remediation

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

type podResourcesServer struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	pods []*podresourcesv1.PodResources
}

func (s *podResourcesServer) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return &podresourcesv1.ListPodResourcesResponse{PodResources: s.pods}, nil
}

func servePodResources(t *testing.T, pods ...*podresourcesv1.PodResources) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	lis, err := (&net.ListenConfig{}).Listen(t.Context(), "unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, &podResourcesServer{pods: pods})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return sock
}

func devicePluginPod(ns, name string, ids ...string) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesv1.ContainerResources{
		{Name: "idle"},
		{Name: "main", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: ids}}},
	}}
}

func TestPodResourcesHolders(t *testing.T) {
	sock := servePodResources(t,
		devicePluginPod("ml", "whole", "GPU-a", "GPU-b"),
		devicePluginPod("ml", "replica", "GPU-c::3"),
		devicePluginPod("ml", "mig", "MIG-c1"),
		devicePluginPod("ml", "other", "GPU-d", "GPU-ab"),
	)
	p := PodResources{Socket: sock}
	cases := []struct {
		name string
		dev  health.Device
		migs []health.Device
		want []string
	}{
		{"whole GPU", health.Device{UUID: "GPU-a"}, nil, []string{"ml/whole"}},
		{"case does not matter", health.Device{UUID: "gpu-B"}, nil, []string{"ml/whole"}},
		{"replica and MIG instance", health.Device{UUID: "GPU-c"}, []health.Device{{UUID: "MIG-c1"}}, []string{"ml/mig", "ml/replica"}},
		{"prefix is not a match", health.Device{UUID: "GPU-e"}, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Holders(t.Context(), tc.dev, tc.migs)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("holders %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPodResourcesUnreachableIsAnError(t *testing.T) {
	p := PodResources{Socket: filepath.Join(t.TempDir(), "none.sock")}
	if _, err := p.Holders(t.Context(), health.Device{UUID: "GPU-a"}, nil); err == nil || !strings.Contains(err.Error(), "none.sock") {
		t.Fatalf("error %v, want one naming the socket", err)
	}
}

type staticCatalog struct{ c *dra.Catalog }

func (s staticCatalog) Catalog(context.Context) (*dra.Catalog, error) { return s.c, nil }

func slice(node string, uuids ...string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-gpus"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: "gpu.nvidia.com", NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
	}}
	for i, u := range uuids {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: "gpu-" + string(rune('0'+i)),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To(u)}}})
	}
	return s
}

func claimPod(name, node string, phase corev1.PodPhase, claim string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name}, Spec: corev1.PodSpec{NodeName: node,
		ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}},
		Status: corev1.PodStatus{Phase: phase}}
}

func allocated(name, pool, device string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name}}
	if device != "" {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: "gpu.nvidia.com", Pool: pool, Device: device}}}}
	}
	return c
}

func TestClaimHolders(t *testing.T) {
	catalog, _ := dra.NewCatalog([]*resourceapi.ResourceSlice{slice("n1", "GPU-a", "GPU-b")}, "n1", "gpu.nvidia.com", dra.DefaultAttributes())
	// The fake clientset ignores field selectors: the pod on n2 must be left out all the same.
	client := fake.NewClientset(
		claimPod("runs", "n1", corev1.PodRunning, "c-a"),
		claimPod("done", "n1", corev1.PodSucceeded, "c-a-old"),
		claimPod("pending", "n1", corev1.PodPending, "c-unallocated"),
		claimPod("elsewhere", "n2", corev1.PodRunning, "c-a"),
		allocated("c-a", "n1", "gpu-0"),
		allocated("c-a-old", "n1", "gpu-0"),
		allocated("c-unallocated", "", ""),
	)
	c := Claims{Client: adapt.Clientset(client), NodeName: "n1", Driver: "gpu.nvidia.com", Devices: staticCatalog{catalog}}
	got, err := c.Holders(t.Context(), health.Device{UUID: "GPU-a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ml/runs (claim c-a)"}; !slices.Equal(got, want) {
		t.Errorf("holders of GPU-a %v, want %v", got, want)
	}
	if got, err := c.Holders(t.Context(), health.Device{UUID: "GPU-b"}, nil); err != nil || len(got) != 0 {
		t.Errorf("holders of GPU-b %v, %v; want none", got, err)
	}
	if _, err := client.CoreV1().Pods("ml").Create(t.Context(), claimPod("lost-claim", "n1", corev1.PodRunning, "missing"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Holders(t.Context(), health.Device{UUID: "GPU-b"}, nil); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("unreadable claim: %v, want an error", err)
	}
}

type finderFunc func() ([]string, error)

func (f finderFunc) Holders(context.Context, health.Device, []health.Device) ([]string, error) {
	return f()
}

func TestAllHoldersUnionAndErrors(t *testing.T) {
	a := AllHolders{finderFunc(func() ([]string, error) { return []string{"b/x", "a/y"}, nil }), finderFunc(func() ([]string, error) { return []string{"a/y"}, nil })}
	got, err := a.Holders(t.Context(), health.Device{}, nil)
	if err != nil || !slices.Equal(got, []string{"a/y", "b/x"}) {
		t.Fatalf("%v %v", got, err)
	}
	a = append(a, finderFunc(func() ([]string, error) { return nil, errors.New("boom") }))
	if _, err := a.Holders(t.Context(), health.Device{}, nil); err == nil {
		t.Fatal("an error was dropped")
	}
}
