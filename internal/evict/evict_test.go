package evict

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

const node = "gpu-node"

var (
	gpu0 = health.Device{UUID: "GPU-0000", Index: 0}
	gpu1 = health.Device{UUID: "GPU-1111", Index: 1}
	mig1 = health.Device{UUID: "MIG-1111-a", Index: 1, MIG: &health.MIGPlacement{ParentUUID: "GPU-1111", GPUInstance: 1}}
)

// snapshot has gpu0 healthy and gpu1 lost (asking for eviction), with a MIG instance.
func snapshot() health.Snapshot {
	return health.Snapshot{Devices: []health.DeviceStatus{
		{Device: gpu0, Health: health.Healthy},
		{Device: gpu1, Health: health.Unhealthy, Evict: true},
		{Device: mig1, Health: health.Unhealthy, Evict: true},
	}}
}

type fakeLister struct {
	pods map[string][]string // "ns/name" -> device IDs of nvidia.com/gpu
	err  error
}

func (f *fakeLister) List(context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for key, ids := range f.pods {
		ns, name, _ := strings.Cut(key, "/")
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{Namespace: ns, Name: name,
			Containers: []*podresourcesv1.ContainerResources{{Name: "c", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: ids}}}}})
	}
	return resp, nil
}

type fakeEvicter struct {
	evicted []string
	refuse  map[string]int // pod -> how many more times to answer 429
}

func (f *fakeEvicter) Evict(_ context.Context, ev *policyv1.Eviction) error {
	key := ev.Namespace + "/" + ev.Name
	if f.refuse[key] > 0 {
		f.refuse[key]--
		return apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10)
	}
	if ev.DeleteOptions == nil || ev.DeleteOptions.Preconditions == nil || ev.DeleteOptions.Preconditions.UID == nil {
		return errors.New("eviction without a UID precondition")
	}
	f.evicted = append(f.evicted, key)
	return nil
}

type fakeBreaker struct{ ok bool }

func (b fakeBreaker) Admit(context.Context, string) (bool, error) { return b.ok, nil }

func pod(key string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	ns, name, _ := strings.Cut(key, "/")
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, m := range mutate {
		m(p)
	}
	return p
}

type rig struct {
	ev       *Evictor
	evicter  *fakeEvicter
	lister   *fakeLister
	recorder *record.FakeRecorder
	clock    *clocktesting.FakeClock
	client   *fake.Clientset
}

func newRig(t *testing.T, pods []*corev1.Pod, devicePlugin map[string][]string, mutate func(*Options)) *rig {
	t.Helper()
	objs := []any{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}}
	for _, p := range pods {
		objs = append(objs, p)
	}
	client := fake.NewClientset()
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Node:
			_, _ = client.CoreV1().Nodes().Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, _ = client.CoreV1().Pods(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{})
		}
	}
	r := &rig{evicter: &fakeEvicter{refuse: map[string]int{}}, lister: &fakeLister{pods: devicePlugin},
		recorder: record.NewFakeRecorder(100), clock: clocktesting.NewFakeClock(time.Unix(1_000_000, 0)), client: client}
	kc := adapt.Clientset(client)
	opts := Options{NodeName: node, Client: kc, Evicter: r.evicter, Recorder: r.recorder, Clock: r.clock,
		Finders: []Finder{PodResources{Lister: r.lister}, Volcano{Client: kc, NodeName: node}}, Self: "gpuhealth/agent-x"}
	if mutate != nil {
		mutate(&opts)
	}
	ev, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.ev = ev
	ev.Update(snapshot())
	return r
}

func (r *rig) events() []string {
	var out []string
	for {
		select {
		case e := <-r.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (r *rig) annotation(t *testing.T) map[string]gpuhealthv1.GPUEvictions {
	t.Helper()
	n, err := r.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := gpuhealthv1.ParseEvictions(n.Annotations[gpuhealthv1.EvictionsKey])
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func hasEvent(events []string, reason string) bool {
	return slices.ContainsFunc(events, func(e string) bool { return strings.Contains(e, " "+reason+" ") })
}

func TestEvictsOnlyThePodsHoldingTheSickGPU(t *testing.T) {
	r := newRig(t, []*corev1.Pod{pod("ml/on-gpu1"), pod("ml/on-mig1"), pod("ml/on-gpu0"), pod("ml/replica")},
		map[string][]string{"ml/on-gpu1": {"GPU-1111"}, "ml/on-mig1": {"MIG-1111-a"}, "ml/on-gpu0": {"GPU-0000"}, "ml/replica": {"GPU-1111::3"}}, nil)
	r.ev.Round(context.Background())
	if want := []string{"ml/on-gpu1", "ml/on-mig1", "ml/replica"}; !slices.Equal(r.evicter.evicted, want) {
		t.Fatalf("evicted %v, want %v", r.evicter.evicted, want)
	}
	events := r.events()
	if n := len(slices.DeleteFunc(slices.Clone(events), func(e string) bool { return !strings.Contains(e, "GPUEvicted") })); n != 6 {
		t.Fatalf("%d GPUEvicted events (want one on the pod and one on the Node per eviction): %q", n, events)
	}
	r.ev.Round(context.Background())
	if len(r.evicter.evicted) != 3 {
		t.Fatalf("a second round evicted again: %v", r.evicter.evicted)
	}
}

func TestABudgetThatRefusesIsRetriedWithBackoff(t *testing.T) {
	r := newRig(t, []*corev1.Pod{pod("ml/guarded")}, map[string][]string{"ml/guarded": {"GPU-1111"}}, func(o *Options) { o.Retry = time.Second })
	r.evicter.refuse["ml/guarded"] = 2
	ctx := context.Background()
	r.ev.Round(ctx)
	if got := r.annotation(t)["GPU-1111"]; len(got.Pods) != 1 || got.Pods[0].State != gpuhealthv1.EvictionBlocked {
		t.Fatalf("annotation %+v, want the pod Blocked", got)
	}
	if !hasEvent(r.events(), "GPUEvictionBlocked") {
		t.Fatal("no GPUEvictionBlocked event")
	}
	r.ev.Round(ctx) // within the backoff: not asked again
	if r.evicter.refuse["ml/guarded"] != 1 {
		t.Fatalf("asked again within the backoff")
	}
	r.clock.Step(time.Second)
	r.ev.Round(ctx) // refused again: backoff doubles to 2s
	r.clock.Step(time.Second)
	r.ev.Round(ctx)
	if len(r.evicter.evicted) != 0 {
		t.Fatal("evicted before the doubled backoff ran out")
	}
	r.clock.Step(time.Second)
	r.ev.Round(ctx)
	if !slices.Equal(r.evicter.evicted, []string{"ml/guarded"}) {
		t.Fatalf("evicted %v once the budget allowed it", r.evicter.evicted)
	}
	if got := r.annotation(t); len(got) != 0 {
		t.Fatalf("annotation %+v left after the eviction", got)
	}
}

func TestDryRunListsAndEvictsNothing(t *testing.T) {
	r := newRig(t, []*corev1.Pod{pod("ml/a")}, map[string][]string{"ml/a": {"GPU-1111"}}, func(o *Options) { o.DryRun = true })
	r.ev.Round(context.Background())
	if len(r.evicter.evicted) != 0 {
		t.Fatalf("dry run evicted %v", r.evicter.evicted)
	}
	got := r.annotation(t)["GPU-1111"]
	if len(got.Pods) != 1 || got.Pods[0].Pod != "ml/a" || got.Pods[0].Via != ViaDevicePlugin || got.Pods[0].State != gpuhealthv1.EvictionDryRun ||
		!got.Pods[0].Since.Equal(r.clock.Now()) || got.Index != 1 {
		t.Fatalf("annotation %+v", got)
	}
	if !hasEvent(r.events(), "GPUEvictionDryRun") {
		t.Fatal("no GPUEvictionDryRun event")
	}
}

func TestPodResourcesUnreachableEvictsNothing(t *testing.T) {
	r := newRig(t, []*corev1.Pod{pod("ml/a", func(p *corev1.Pod) { p.Annotations = map[string]string{scheduling.GPUIndexAnnotation: "1"} })}, nil, nil)
	r.lister.err = errors.New("dial unix /var/lib/kubelet/pod-resources/kubelet.sock: connect: no such file or directory")
	r.ev.Round(context.Background())
	if len(r.evicter.evicted) != 0 {
		t.Fatalf("evicted %v without knowing who holds the GPU", r.evicter.evicted)
	}
	events := r.events()
	if !hasEvent(events, "GPUEvictionUnknown") || !strings.Contains(strings.Join(events, "\n"), "no such file") {
		t.Fatalf("events %q: want a GPUEvictionUnknown saying why", events)
	}
	r.ev.Round(context.Background())
	if hasEvent(r.events(), "GPUEvictionUnknown") {
		t.Fatal("the same reason was recorded twice")
	}
}

func TestIndexDeviceIDs(t *testing.T) {
	r := newRig(t, []*corev1.Pod{pod("ml/by-index"), pod("ml/mig-by-index"), pod("ml/odd"), pod("ml/other-index")},
		map[string][]string{"ml/by-index": {"1"}, "ml/mig-by-index": {"1:0"}, "ml/odd": {"card-one"}, "ml/other-index": {"0"}}, nil)
	r.ev.Round(context.Background())
	if want := []string{"ml/by-index", "ml/mig-by-index"}; !slices.Equal(r.evicter.evicted, want) {
		t.Fatalf("evicted %v, want %v", r.evicter.evicted, want)
	}
	all := strings.Join(r.events(), "\n")
	if !strings.Contains(all, `"card-one" is neither a UUID nor an index; left alone`) || !strings.Contains(all, "matched to GPU 1") {
		t.Fatalf("events %s: want warnings for the index match and the unreadable ID", all)
	}
}

func TestVolcanoPodsByCard(t *testing.T) {
	ann := func(kv ...string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Annotations = map[string]string{}
			for i := 0; i < len(kv); i += 2 {
				p.Annotations[kv[i]] = kv[i+1]
			}
		}
	}
	r := newRig(t, []*corev1.Pod{
		pod("share/on-card1", ann(scheduling.GPUIndexAnnotation, "1")),
		pod("share/on-card0", ann(scheduling.GPUIndexAnnotation, "0")),
		pod("share/moved", ann(scheduling.GPUIndexAnnotation, "1", scheduling.GPUUUIDAnnotation, "GPU-0000")), // the UUID wins
		pod("share/by-uuid", ann(scheduling.GPUUUIDAnnotation, "GPU-1111")),
		pod("share/garbage", ann(scheduling.GPUIndexAnnotation, "one")),
		pod("share/elsewhere", ann(scheduling.GPUIndexAnnotation, "1"), func(p *corev1.Pod) { p.Spec.NodeName = "other" }),
	}, nil, nil)
	r.ev.Round(context.Background())
	if want := []string{"share/by-uuid", "share/on-card1"}; !slices.Equal(r.evicter.evicted, want) {
		t.Fatalf("evicted %v, want %v", r.evicter.evicted, want)
	}
	if !strings.Contains(strings.Join(r.events(), "\n"), "is not a card index; left alone") {
		t.Fatal("no warning for the unreadable card index")
	}
}

func TestPodsThatAreNotEvicted(t *testing.T) {
	ds := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr.To(true)}}
	}
	pods := []*corev1.Pod{pod("gpuhealth/agent-x"), pod("ml/daemon", ds), pod("kube-system/excluded"), pod("research/reported"), pod("ml/done", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })}
	ids := map[string][]string{}
	for _, p := range pods {
		ids[p.Namespace+"/"+p.Name] = []string{"GPU-1111"}
	}
	r := newRig(t, pods, ids, func(o *Options) {
		o.ExcludeNamespaces, o.ReportOnlyNamespaces = []string{"kube-system"}, []string{"research"}
	})
	r.ev.Round(context.Background())
	if len(r.evicter.evicted) != 0 {
		t.Fatalf("evicted %v", r.evicter.evicted)
	}
	events := r.events()
	if !hasEvent(events, "GPUEvictionReportOnly") || !hasEvent(events, "GPUEvictionSkipped") {
		t.Fatalf("events %q: want ReportOnly for research/reported and Skipped for the DaemonSet pod", events)
	}
	if got := r.annotation(t)["GPU-1111"]; len(got.Pods) != 1 || got.Pods[0].Pod != "research/reported" {
		t.Fatalf("annotation %+v, want only the report-only pod", got)
	}
}

func TestTheBreakerHoldsEvictions(t *testing.T) {
	r := newRig(t, []*corev1.Pod{pod("ml/a")}, map[string][]string{"ml/a": {"GPU-1111"}}, func(o *Options) { o.Breaker = fakeBreaker{ok: false} })
	r.ev.Round(context.Background())
	if len(r.evicter.evicted) != 0 {
		t.Fatalf("evicted %v past the breaker", r.evicter.evicted)
	}
	if got := r.annotation(t)["GPU-1111"]; len(got.Pods) != 1 || got.Pods[0].State != gpuhealthv1.EvictionHeld {
		t.Fatalf("annotation %+v, want the pod Held", got)
	}
	if !hasEvent(r.events(), "GPUEvictionHeld") {
		t.Fatal("no GPUEvictionHeld event")
	}
}

func TestGracePeriod(t *testing.T) {
	r := newRig(t, []*corev1.Pod{pod("ml/a")}, map[string][]string{"ml/a": {"GPU-1111"}}, func(o *Options) { o.GracePeriod = time.Minute })
	ctx := context.Background()
	r.ev.Round(ctx)
	r.clock.Step(59 * time.Second)
	r.ev.Round(ctx)
	if len(r.evicter.evicted) != 0 {
		t.Fatal("evicted within the grace period")
	}
	// The condition clears and returns: a new grace period starts.
	r.ev.Update(health.Snapshot{Devices: []health.DeviceStatus{{Device: gpu1}}})
	r.ev.Round(ctx)
	r.ev.Update(snapshot())
	r.clock.Step(2 * time.Second)
	r.ev.Round(ctx)
	if len(r.evicter.evicted) != 0 {
		t.Fatal("a cleared condition kept its grace period")
	}
	r.clock.Step(time.Minute)
	r.ev.Round(ctx)
	if !slices.Equal(r.evicter.evicted, []string{"ml/a"}) {
		t.Fatalf("evicted %v after the grace period", r.evicter.evicted)
	}
}

// TestMIGInstanceAloneMatchesByUUIDOnly: when one MIG instance asks for eviction and its GPU
// does not, only the pods holding that instance by UUID are evicted. An index ID ("1:1") names
// the GPU and the device plugin's own count of its instances, so it cannot say which instance a
// pod holds: such a pod is left alone with a warning, never guessed. Volcano shares whole cards,
// never MIG instances: a Volcano pod on the card stays.
func TestMIGInstanceAloneMatchesByUUIDOnly(t *testing.T) {
	mig1b := health.Device{UUID: "MIG-1111-b", Index: 1, MIG: &health.MIGPlacement{ParentUUID: "GPU-1111", GPUInstance: 2}}
	r := newRig(t, []*corev1.Pod{pod("ml/on-mig1"), pod("ml/on-mig1b"), pod("ml/mig-by-index"), pod("ml/gpu-by-index"),
		pod("share/on-card1", func(p *corev1.Pod) { p.Annotations = map[string]string{scheduling.GPUIndexAnnotation: "1"} })},
		map[string][]string{"ml/on-mig1": {"MIG-1111-a"}, "ml/on-mig1b": {"MIG-1111-b"}, "ml/mig-by-index": {"1:1"}, "ml/gpu-by-index": {"1"}}, nil)
	r.ev.Update(health.Snapshot{Devices: []health.DeviceStatus{
		{Device: gpu0, Health: health.Healthy},
		{Device: gpu1, Health: health.Healthy},
		{Device: mig1, Health: health.Unhealthy, Evict: true},
		{Device: mig1b, Health: health.Healthy},
	}})
	r.ev.Round(context.Background())
	if want := []string{"ml/on-mig1"}; !slices.Equal(r.evicter.evicted, want) {
		t.Fatalf("evicted %v, want %v", r.evicter.evicted, want)
	}
	all := strings.Join(r.events(), "\n")
	if !strings.Contains(all, `"1:1" is an index on GPU 1, whose MIG instance MIG-1111-a asks for eviction`) || !strings.Contains(all, "left alone") {
		t.Fatalf("events %s: want a warning that the index cannot name the instance", all)
	}
}

// TestAFaultThatReturnsStartsAfresh: a pod a PDB blocks, whose GPU stops asking for eviction
// and later asks again, is a new case: its pending entry is dated from the new fault and its
// backoff starts from retry again. The Evictor keeps nothing of the pods no GPU asks about.
func TestAFaultThatReturnsStartsAfresh(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, []*corev1.Pod{pod("ml/guarded")}, map[string][]string{"ml/guarded": {"GPU-1111"}}, nil)
	r.evicter.refuse["ml/guarded"] = 100
	r.ev.Round(ctx) // refused: backoff 10s
	r.clock.Step(10 * time.Second)
	r.ev.Round(ctx) // refused: backoff 20s
	r.clock.Step(20 * time.Second)
	r.ev.Round(ctx) // refused: backoff 40s
	if r.evicter.refuse["ml/guarded"] != 97 {
		t.Fatalf("%d refusals, want 3", 100-r.evicter.refuse["ml/guarded"])
	}

	r.ev.Update(health.Snapshot{Devices: []health.DeviceStatus{{Device: gpu0, Health: health.Healthy}, {Device: gpu1, Health: health.Healthy}}})
	r.ev.Round(ctx)
	if len(r.ev.pods) != 0 {
		t.Fatalf("the Evictor still keeps %d pods that no GPU asks about", len(r.ev.pods))
	}

	r.clock.Step(time.Minute)
	returned := r.clock.Now()
	r.ev.Update(snapshot())
	r.ev.Round(ctx) // refused: backoff 10s again
	got := r.annotation(t)["GPU-1111"]
	if len(got.Pods) != 1 || got.Pods[0].State != gpuhealthv1.EvictionBlocked || !got.Pods[0].Since.Equal(returned) {
		t.Fatalf("annotation %+v, want the pod Blocked since the fault returned (%s)", got, returned)
	}
	r.clock.Step(10 * time.Second)
	r.ev.Round(ctx)
	if n := 100 - r.evicter.refuse["ml/guarded"]; n != 5 {
		t.Fatalf("%d refusals, want 5: the backoff did not start again from retry", n)
	}
}
