package claimstatus

import (
	"context"
	"errors"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/kube/podresources"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestDesiredAndDiffers(t *testing.T) {
	s := New(nil, "n1", Options{Driver: "gpu.nvidia.com", UUIDAttribute: "uuid"})
	str := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(v)} }
	slice := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: ptr.To("n1"),
		Pool: resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1},
		Devices: []resourceapi.Device{
			{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": str("GPU-a")}},
			{Name: "gpu-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": str("GPU-b")}},
			{Name: "gpu-0-mig-1g10gb-19-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"parentUUID": str("GPU-a")}},
			{Name: "gpu-1-mig-1g10gb-19-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"parentUUID": str("GPU-b")}},
		}}}
	catalog, problems := dra.NewCatalog([]*resourceapi.ResourceSlice{slice}, "n1", "gpu.nvidia.com", dra.DefaultAttributes())
	if len(problems) > 0 {
		t.Fatalf("problems: %v", problems)
	}
	assigned, _ := catalog.Assign(health.Snapshot{Devices: []health.DeviceStatus{
		{Device: health.Device{UUID: "GPU-a"}, Health: health.Unhealthy, Evict: true,
			Conditions: []health.Condition{{Type: health.ConditionXID, Severity: health.Unhealthy, Reason: "XID79", Message: "XID 79: GPU has fallen off the bus"}}},
		{Device: health.Device{UUID: "GPU-b"}, Health: health.Healthy},
	}})
	claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0"},
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-1"},
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0-mig-1g10gb-19-0"},
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-1-mig-1g10gb-19-0"},
			{Driver: "gpu.nvidia.com", Pool: "other-node", Device: "gpu-0"},
			{Driver: "other.driver", Pool: "n1", Device: "gpu-0"},
		}},
	}}}
	want := s.desired(claim, assigned)
	if len(want) != 2 {
		t.Fatalf("desired = %+v, want conditions for the sick GPU and its MIG partition only", want)
	}
	for _, dev := range []string{"gpu-0", "gpu-0-mig-1g10gb-19-0"} {
		c := want[dra.DeviceID{Pool: "n1", Device: dev}]
		if c.Type != ConditionType || c.Status != metav1.ConditionFalse || c.Reason != ReasonUnhealthy ||
			!strings.Contains(c.Message, "XID79") || !strings.Contains(c.Message, "eviction requested") {
			t.Errorf("condition of %s = %+v", dev, c)
		}
	}
	if !s.differs(claim, catalog, want) {
		t.Error("a claim without the condition does not differ from one with it")
	}
	for key, c := range want {
		claim.Status.Devices = append(claim.Status.Devices, resourceapi.AllocatedDeviceStatus{Driver: "gpu.nvidia.com", Pool: key.Pool, Device: key.Device, Conditions: []metav1.Condition{c}})
	}
	if s.differs(claim, catalog, want) {
		t.Error("the claim already carries the conditions, yet differs")
	}
	if !s.differs(claim, catalog, map[dra.DeviceID]metav1.Condition{}) {
		t.Error("recovery (no condition wanted) does not differ from a claim that has one")
	}
}

func TestSyncBeforeStartIsAnError(t *testing.T) {
	if _, err := New(nil, "n1", Options{}).Sync(t.Context(), health.Snapshot{}); err == nil {
		t.Fatal("Sync before Start succeeded")
	}
}

func TestStartNeedsAWayToFindClaims(t *testing.T) {
	client := fake.NewClientset()
	err := New(adapt.Clientset(client), "n1", Options{Driver: "gpu.nvidia.com"}).Start(t.Context(), func() {})
	if err == nil || !strings.Contains(err.Error(), "pod-resources") {
		t.Fatalf("Start without pod-resources or a pod watch = %v, want an error naming what is missing", err)
	}
}

// fakeKubelet answers pod-resources List with the claims of its pods.
type fakeKubelet struct {
	mu    sync.Mutex
	pods  map[string][]string // "namespace/pod" -> claim names
	err   error
	lists int
}

func (k *fakeKubelet) set(pod string, claims ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pods == nil {
		k.pods = map[string][]string{}
	}
	k.pods[pod] = claims
}

func (k *fakeKubelet) fail(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.err = err
}

func (k *fakeKubelet) List(context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lists++
	if k.err != nil {
		return nil, k.err
	}
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for _, key := range slices.Sorted(maps.Keys(k.pods)) {
		ns, name, _ := strings.Cut(key, "/")
		c := &podresourcesv1.ContainerResources{Name: "main"}
		for _, claim := range k.pods[key] {
			c.DynamicResources = append(c.DynamicResources, &podresourcesv1.DynamicResource{ClaimName: claim, ClaimNamespace: ns,
				ClaimResources: []*podresourcesv1.ClaimResource{{DriverName: "gpu.nvidia.com", PoolName: "n1", DeviceName: "gpu-0"}}})
		}
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{Name: name, Namespace: ns, Containers: []*podresourcesv1.ContainerResources{c}})
	}
	return resp, nil
}

// fixture is node n1 with GPUs GPU-a (gpu-0) and GPU-b (gpu-1), claims c1..c3 in namespace ns
// holding gpu-0, and the claims the syncer reads, by name.
type fixture struct {
	client *fake.Clientset
	clock  *testingclock.FakeClock
	mu     sync.Mutex
	gets   []string
}

func newFixture(t *testing.T, kubeletVersion string, objs ...runtime.Object) *fixture {
	t.Helper()
	gpuSlice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "n1-gpus"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: ptr.To("n1"), Pool: resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{
				{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To("GPU-a")}}},
				{Name: "gpu-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To("GPU-b")}}},
			}},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: kubeletVersion}}}
	objs = append(objs, gpuSlice, node)
	for _, name := range []string{"c1", "c2", "c3"} {
		objs = append(objs, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0"}},
			}}}})
	}
	f := &fixture{client: fake.NewClientset(objs...), clock: testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))}
	f.client.PrependReactor("get", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.gets = append(f.gets, a.(k8stesting.GetAction).GetName())
		return false, nil, nil
	})
	return f
}

func (f *fixture) start(t *testing.T, opts Options) *Syncer {
	t.Helper()
	opts.Driver, opts.UUIDAttribute, opts.Clock = "gpu.nvidia.com", "uuid", f.clock
	s := New(adapt.Clientset(f.client), "n1", opts)
	if err := s.Start(t.Context(), func() {}); err != nil {
		t.Fatal(err)
	}
	return s
}

// reads returns the claims read since the last call, sorted.
func (f *fixture) reads() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.gets
	f.gets = nil
	slices.Sort(out)
	return out
}

// snap is a snapshot where GPU-a is Healthy and GPU-b has bHealth.
func snap(bHealth health.Severity) health.Snapshot {
	b := health.DeviceStatus{Device: health.Device{UUID: "GPU-b", Index: 1}, Health: bHealth}
	if bHealth != health.Healthy {
		b.Conditions = []health.Condition{{Type: health.ConditionXID, Severity: bHealth, Reason: "XID48"}}
	}
	return health.Snapshot{Devices: []health.DeviceStatus{{Device: health.Device{UUID: "GPU-a"}, Health: health.Healthy}, b}}
}

type step struct {
	name   string
	before func()
	snap   health.Snapshot
	reads  []string
}

// run syncs each step and checks the claims it read; no step writes (the claims hold the
// healthy GPU-a).
func run(t *testing.T, f *fixture, s *Syncer, steps []step) {
	t.Helper()
	for _, st := range steps {
		if st.before != nil {
			st.before()
		}
		if n, err := s.Sync(t.Context(), st.snap); err != nil || n != 0 {
			t.Fatalf("%s: Sync = %d, %v; want no writes (the claims hold the healthy GPU)", st.name, n, err)
		}
		if got := f.reads(); !slices.Equal(got, st.reads) {
			t.Errorf("%s: read claims %v, want %v", st.name, got, st.reads)
		}
	}
}

// TestClaimsAreReadOnlyWhenThereIsSomethingToCheck: the kubelet names the node's claims, and
// they are read once after start, when the conditions they should carry change, when they come
// to the node while a GPU is sick, and every Recheck; never a claim of another node.
func TestClaimsAreReadOnlyWhenThereIsSomethingToCheck(t *testing.T) {
	f := newFixture(t, "v1.37.2")
	kubelet := &fakeKubelet{}
	kubelet.set("ns/p1", "c1")
	s := f.start(t, Options{PodResources: kubelet})
	run(t, f, s, []step{
		{name: "first sync checks every claim on the node", snap: snap(health.Healthy), reads: []string{"c1"}},
		{name: "all healthy, nothing marked: no reads", snap: snap(health.Healthy)},
		{name: "a GPU is sick: the node's claims are checked", snap: snap(health.Unhealthy), reads: []string{"c1"}},
		{name: "still sick, the same claims: no reads", snap: snap(health.Unhealthy)},
		{name: "a pod with a claim starts while a GPU is sick: that claim only", before: func() { kubelet.set("ns/p3", "c3") },
			snap: snap(health.Unhealthy), reads: []string{"c3"}},
		{name: "the sickness changes: every claim on the node again", snap: snap(health.Degraded), reads: []string{"c1", "c3"}},
		{name: "a recheck later, still sick: every claim again", before: func() { f.clock.Step(DefaultRecheck) },
			snap: snap(health.Degraded), reads: []string{"c1", "c3"}},
		{name: "recovered, nothing was written: no reads", snap: snap(health.Healthy)},
	})
	if f.client.Actions() == nil {
		t.Fatal("no actions recorded")
	}
	for _, a := range f.client.Actions() {
		if a.GetResource().Resource == "pods" {
			t.Errorf("the syncer read pods (%s): the kubelet names the claims", a.GetVerb())
		}
	}
}

// TestPodWatchFindsTheSameClaims: with PodWatch the claims come from the node's pods.
func TestPodWatchFindsTheSameClaims(t *testing.T) {
	pod := func(name, node, claim string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec:       corev1.PodSpec{NodeName: node, ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}},
		}
	}
	f := newFixture(t, "v1.33.0", pod("p1", "n1", "c1"), pod("p2", "n2", "c2"))
	s := f.start(t, Options{PodWatch: true})
	run(t, f, s, []step{
		{name: "first sync checks every claim on the node", snap: snap(health.Healthy), reads: []string{"c1"}},
		{name: "all healthy, nothing marked: no reads", snap: snap(health.Healthy)},
		{name: "a GPU is sick: the node's claims are checked", snap: snap(health.Unhealthy), reads: []string{"c1"}},
		{name: "recovered, nothing was written: no reads", snap: snap(health.Healthy)},
	})
	if !s.NextSync().IsZero() {
		t.Errorf("a pod watch needs no polling, yet NextSync = %v", s.NextSync())
	}
}

// TestAKubeletThatNamesNoClaimsIsSaidOnce: a kubelet older than 1.34 does not name claims by
// default: the syncer says so once, reads no claim, counts each sync with a GPU it cannot
// mark, and tries again; once the kubelet names a claim, it believes it.
func TestAKubeletThatNamesNoClaimsIsSaidOnce(t *testing.T) {
	f := newFixture(t, "v1.33.4-eks-1234")
	kubelet := &fakeKubelet{}
	kubelet.set("ns/plain") // a pod without claims, as the kubelet reports every pod
	var said []string
	unmarked := 0
	s := f.start(t, Options{PodResources: kubelet, Unavailable: func(why string) { said = append(said, why) }, Unmarked: func() { unmarked++ }})
	run(t, f, s, []step{
		{name: "healthy: nothing to read, the kubelet names no claim", snap: snap(health.Healthy)},
		{name: "healthy again", snap: snap(health.Healthy)},
	})
	if len(said) != 1 || !strings.Contains(said[0], "v1.33.4-eks-1234") || !strings.Contains(said[0], "KubeletPodResourcesDynamicResources") ||
		!strings.Contains(said[0], "podWatch") {
		t.Fatalf("said %q, want once: the kubelet's version, the feature gate and the pod watch", said)
	}
	if unmarked != 0 {
		t.Errorf("unmarked %d while every GPU is healthy", unmarked)
	}
	if got, want := s.NextSync(), f.clock.Now().Add(RetryUnavailable); !got.Equal(want) {
		t.Errorf("NextSync = %v, want a retry at %v", got, want)
	}
	run(t, f, s, []step{{name: "a GPU is sick: still no claim to read", snap: snap(health.Unhealthy)}})
	if len(said) != 1 || unmarked != 1 {
		t.Errorf("said %d times, unmarked %d: want still once, and one sync that could not mark", len(said), unmarked)
	}
	if got, want := s.NextSync(), f.clock.Now().Add(DefaultPoll); !got.Equal(want) {
		t.Errorf("NextSync while sick = %v, want %v", got, want)
	}
	kubelet.set("ns/p1", "c1") // the gate is on after all
	run(t, f, s, []step{
		{name: "the kubelet names a claim: it is read", snap: snap(health.Unhealthy), reads: []string{"c1"}},
		{name: "recovered, nothing written", snap: snap(health.Healthy)},
	})
	kubelet.set("ns/p1")
	run(t, f, s, []step{{name: "its pod is gone: no claims, and no doubt any more", snap: snap(health.Unhealthy)}})
	if len(said) != 1 || unmarked != 1 {
		t.Errorf("said %d times, unmarked %d after the kubelet named a claim", len(said), unmarked)
	}
}

// TestANodeWithoutDRADevicesLooksForNoClaims: on a node whose driver publishes no DRA device
// (device plugins only) no claim can hold one: the kubelet is not asked, and an old kubelet is
// not worth a word.
func TestANodeWithoutDRADevicesLooksForNoClaims(t *testing.T) {
	f := newFixture(t, "v1.30.0")
	if err := f.client.ResourceV1().ResourceSlices().Delete(t.Context(), "n1-gpus", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubelet := &fakeKubelet{}
	var said []string
	s := f.start(t, Options{PodResources: kubelet, Unavailable: func(why string) { said = append(said, why) }})
	run(t, f, s, []step{
		{name: "first sync", snap: snap(health.Healthy)},
		{name: "a GPU is sick", snap: snap(health.Unhealthy)},
	})
	if kubelet.lists != 0 || len(said) != 0 || !s.NextSync().IsZero() {
		t.Errorf("asked the kubelet %d times, said %q, next sync %v: want nothing", kubelet.lists, said, s.NextSync())
	}
}

func TestNamesClaims(t *testing.T) {
	for v, want := range map[string]bool{
		"v1.26.3": false, "v1.33.4-eks-1234": false, "v1.34.0": true, "v1.34.0-rc.1": true, "v1.37.2": true, "v2.0.0": true,
		"": true, "garbage": true,
	} {
		if got := namesClaims(v); got != want {
			t.Errorf("namesClaims(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestAMissingSocketIsSaidAndTheKubeletFoundLater runs the real pod-resources client: a socket
// that is not there is said once (a node without the mount), syncs succeed meanwhile, and the
// claims are checked once a kubelet serves the socket.
func TestAMissingSocketIsSaidAndTheKubeletFoundLater(t *testing.T) {
	f := newFixture(t, "v1.37.2")
	path := filepath.Join(t.TempDir(), "kubelet.sock")
	var said []string
	s := f.start(t, Options{PodResources: podresources.Socket{Path: path}, Unavailable: func(why string) { said = append(said, why) }})
	run(t, f, s, []step{
		{name: "no socket", snap: snap(health.Healthy)},
		{name: "still none", snap: snap(health.Healthy)},
	})
	if len(said) != 1 || !strings.Contains(said[0], path) || !strings.Contains(said[0], "podResourcesSocket") {
		t.Fatalf("said %q, want once, naming the socket and the setting", said)
	}
	kubelet := &fakeKubelet{}
	kubelet.set("ns/p1", "c1")
	serve(t, path, kubelet)
	run(t, f, s, []step{
		{name: "the kubelet is there: the start-up check is done", snap: snap(health.Healthy), reads: []string{"c1"}},
		{name: "then nothing to read", snap: snap(health.Healthy)},
	})
	if !s.NextSync().IsZero() {
		t.Errorf("NextSync = %v, want none: all healthy and the claims found", s.NextSync())
	}
}

// TestAKubeletThatDoesNotAnswerIsRetried: an error other than a missing socket is a failed
// sync (the Writer retries it with backoff), not a cause to stop looking.
func TestAKubeletThatDoesNotAnswerIsRetried(t *testing.T) {
	f := newFixture(t, "v1.37.2")
	kubelet := &fakeKubelet{}
	kubelet.set("ns/p1", "c1")
	kubelet.fail(errors.New("connection refused"))
	var said []string
	s := f.start(t, Options{PodResources: kubelet, Unavailable: func(why string) { said = append(said, why) }})
	if _, err := s.Sync(t.Context(), snap(health.Unhealthy)); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Sync = %v, want the kubelet's error", err)
	}
	kubelet.fail(nil)
	run(t, f, s, []step{{name: "the kubelet answers again", snap: snap(health.Unhealthy), reads: []string{"c1"}}})
	if len(said) != 0 {
		t.Errorf("said %q for an error worth a retry", said)
	}
}

// serve answers pod-resources List at path with kubelet, as the kubelet's gRPC server does.
func serve(t *testing.T, path string, kubelet *fakeKubelet) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, listerServer{kubelet: kubelet})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
}

type listerServer struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	kubelet *fakeKubelet
}

func (l listerServer) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return l.kubelet.List(ctx)
}
