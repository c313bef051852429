package extender

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// The requeue tests run the requeuer on a fake clock: a nudge waits in the rate-limited queue
// until the test moves the clock, so nothing is patched behind the test's back, and the backoff
// between retries is measured in fake time. What the informers' handlers queued is recorded as it
// happens, so "nothing else was requeued" is checked, not waited for.

// requeueEpoch is where the fake clocks start.
var requeueEpoch = time.Unix(1_800_000_000, 0)

// patch is one pod patch the requeuer made (failed ones too), at a time of the fake clock.
type patch struct {
	name string
	at   time.Time
	body []byte
}

// patchLog records the pod patches, in order.
type patchLog struct {
	mu      sync.Mutex
	patches []patch
}

func (l *patchLog) record(p patch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.patches = append(l.patches, p)
}

// of returns the patches of the named pod, or all of them for "".
func (l *patchLog) of(name string) []patch {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []patch
	for _, p := range l.patches {
		if name == "" || p.name == name {
			out = append(out, p)
		}
	}
	return out
}

func (l *patchLog) names() []string {
	var names []string
	for _, p := range l.of("") {
		names = append(names, p.name)
	}
	return names
}

// recordingQueue is the requeuer's queue, recording every pod queued, by name ("uid-NAME").
type recordingQueue struct {
	workqueue.TypedRateLimitingInterface[types.UID]
	mu     sync.Mutex
	queued []string
}

func (q *recordingQueue) record(uid types.UID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queued = append(q.queued, strings.TrimPrefix(string(uid), "uid-"))
}

func (q *recordingQueue) Add(uid types.UID) {
	q.record(uid)
	q.TypedRateLimitingInterface.Add(uid)
}

func (q *recordingQueue) AddAfter(uid types.UID, d time.Duration) {
	q.record(uid)
	q.TypedRateLimitingInterface.AddAfter(uid, d)
}

func (q *recordingQueue) AddRateLimited(uid types.UID) {
	q.record(uid)
	q.TypedRateLimitingInterface.AddRateLimited(uid)
}

// list returns the pods queued so far, sorted: the order of one node's pods is not defined.
func (q *recordingQueue) list() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Sorted(slices.Values(q.queued))
}

// requeueFixture is a Server started with Requeue on a fake clock and a fake clientset.
type requeueFixture struct {
	s       *Server
	client  *fake.Clientset
	clk     *clocktesting.FakeClock
	patches *patchLog
	queue   *recordingQueue
	syncs   int
}

// startedRequeuing starts a requeueFixture holding objs; the patches of the pods in failures are
// answered with the errors given there, in turn.
func startedRequeuing(t *testing.T, failures map[string][]error, objs ...runtime.Object) *requeueFixture {
	t.Helper()
	f := &requeueFixture{client: fake.NewClientset(objs...), clk: clocktesting.NewFakeClock(requeueEpoch), patches: &patchLog{}}
	var mu sync.Mutex
	f.client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		f.patches.record(patch{name: pa.GetName(), at: f.clk.Now(), body: pa.GetPatch()})
		mu.Lock()
		defer mu.Unlock()
		if errs := failures[pa.GetName()]; len(errs) > 0 {
			failures[pa.GetName()] = errs[1:]
			return true, nil, errs[0]
		}
		return false, nil, nil
	})
	f.s = New(f.client, Options{Bind: true, Requeue: true, Clock: f.clk})
	f.queue = &recordingQueue{TypedRateLimitingInterface: f.s.requeue.queue}
	f.s.requeue.queue = f.queue // before Start, which runs the workers
	if err := f.s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return f
}

// sync returns once the node informer's handler has dealt with every node change made so far:
// it adds a node and waits for it in the cache, and the handler takes the events of one informer
// in order, one at a time.
func (f *requeueFixture) sync(t *testing.T) {
	t.Helper()
	f.syncs++
	name := fmt.Sprintf("sync-%d", f.syncs)
	if _, err := f.client.CoreV1().Nodes().Create(t.Context(), node(name, 0, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return cachedNode(f.s, name) != nil })
}

// advanceUntil moves the fake clock on, 50 ms at a time, until cond holds.
func (f *requeueFixture) advanceUntil(t *testing.T, cond func() bool) {
	t.Helper()
	waitFor(t, func() bool {
		if cond() {
			return true
		}
		f.clk.Step(50 * time.Millisecond)
		return false
	})
}

// filterOn runs /filter for the pod on the named nodes (nodeCacheCapable: true).
func filterOn(t *testing.T, s *Server, p *corev1.Pod, names ...string) *extenderv1.ExtenderFilterResult {
	t.Helper()
	res := s.Filter(t.Context(), &extenderv1.ExtenderArgs{Pod: p, NodeNames: &names})
	if res.Error != "" {
		t.Fatal(res.Error)
	}
	return res
}

// setUnhealthy writes the Volcano list of node n (8 GPUs) and waits until the cache has it.
func (f *requeueFixture) setUnhealthy(t *testing.T, n, ids string) {
	t.Helper()
	var ann map[string]string
	if ids != "" {
		ann = map[string]string{gpuhealthv1.UnhealthyIDsKey: ids}
	}
	if _, err := f.client.CoreV1().Nodes().Update(t.Context(), node(n, 8, ann), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := 0
	if ids != "" {
		want = len(strings.Split(ids, ","))
	}
	waitFor(t, func() bool { return cachedNode(f.s, n) != nil && cachedNode(f.s, n).Unhealthy == want })
}

// cachedNode returns the node as the extender's cache has it, or nil.
func cachedNode(s *Server, name string) (node *scheduling.NodeGPUs) {
	s.state.read(func(v view) { node, _ = v.node(name, nil) })
	return node
}

func isRemembered(s *Server, name string) bool {
	_, _, ok := s.requeue.remembered(types.UID("uid-" + name))
	return ok
}

func TestRequeueAfterRecovery(t *testing.T) {
	gpuPod := func(name string) *corev1.Pod { return pod(name, "", scheduling.ResourceGPU, 4, nil) }
	f := startedRequeuing(t, nil,
		node("sick", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5"}), // 2 free
		node("busy", 8, nil), // 0 free: a running pod holds all 8
		node("free", 8, nil),
		node("cpu", 0, nil),
		pod("running", "busy", scheduling.ResourceGPU, 8, nil),
		gpuPod("waiting"), gpuPod("other"), gpuPod("bound-elsewhere"), gpuPod("bound-by-us"),
	)
	s := f.s

	// Rejected on sick because of GPU health (and on busy and cpu for other reasons).
	if res := filterOn(t, s, gpuPod("waiting"), "sick", "busy", "cpu"); len(*res.NodeNames) != 0 {
		t.Fatalf("waiting fits %v", *res.NodeNames)
	}
	// Rejected only for other reasons: busy is full of work, cpu has no GPUs.
	filterOn(t, s, gpuPod("other"), "busy", "cpu")
	// A probe without identity, and a pod on the Node-objects path, are not remembered either.
	filterOn(t, s, &corev1.Pod{Spec: gpuPod("x").Spec}, "sick")
	nodes := corev1.NodeList{Items: []corev1.Node{*node("sick", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5"})}}
	s.Filter(t.Context(), &extenderv1.ExtenderArgs{Pod: gpuPod("other"), Nodes: &nodes})
	// Rejected on sick, then bound elsewhere: by the default binder (the pod informer sees it),
	// and by our own /bind.
	filterOn(t, s, gpuPod("bound-elsewhere"), "sick", "free")
	filterOn(t, s, gpuPod("bound-by-us"), "sick", "free")
	for name, want := range map[string]bool{"waiting": true, "other": false, "bound-elsewhere": true, "bound-by-us": true} {
		if got := isRemembered(s, name); got != want {
			t.Errorf("%s remembered = %v, want %v", name, got, want)
		}
	}
	bound := gpuPod("bound-elsewhere")
	bound.Spec.NodeName = "free"
	if _, err := f.client.CoreV1().Pods("default").Update(t.Context(), bound, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(t.Context(), &extenderv1.ExtenderBindingArgs{PodName: "bound-by-us", PodNamespace: "default", Node: "free"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !isRemembered(s, "bound-elsewhere") && !isRemembered(s, "bound-by-us") })

	// Worse is not better: another GPU fails.
	f.setUnhealthy(t, "sick", "0,1,2,3,4,5,6")
	f.sync(t)
	if got := f.queue.list(); len(got) != 0 {
		t.Fatalf("queued %v after a GPU failed, want none", got)
	}
	// Recovery.
	f.setUnhealthy(t, "sick", "")
	f.sync(t)
	if got := f.queue.list(); !slices.Equal(got, []string{"waiting"}) {
		t.Fatalf("queued %v after the recovery, want only waiting", got)
	}
	if got := f.patches.names(); len(got) != 0 {
		t.Fatalf("patched %v before the nudge's wait in the queue was over", got)
	}
	f.advanceUntil(t, func() bool { return len(f.patches.of("")) > 0 })
	if got := f.patches.names(); !slices.Equal(got, []string{"waiting"}) {
		t.Fatalf("patched %v, want only waiting", got)
	}
	var body struct {
		Metadata struct {
			UID         types.UID
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(f.patches.of("waiting")[0].body, &body); err != nil {
		t.Fatal(err)
	}
	if body.Metadata.UID != "uid-waiting" {
		t.Errorf("patch carries UID %q, want uid-waiting", body.Metadata.UID)
	}
	if at, err := time.Parse(time.RFC3339Nano, body.Metadata.Annotations[RequeuedAtAnnotation]); err != nil || at.Before(requeueEpoch) {
		t.Errorf("%s = %q (%v), want the fake clock's time", RequeuedAtAnnotation, body.Metadata.Annotations[RequeuedAtAnnotation], err)
	}

	// Updates that do not free GPUs requeue nothing more: the same health again, a Degraded GPU.
	f.setUnhealthy(t, "sick", "")
	if _, err := f.client.CoreV1().Nodes().Update(t.Context(), node("sick", 8, map[string]string{gpuhealthv1.HealthKey: `{"GPU-0":{"index":0,"health":"Degraded"}}`}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.sync(t)
	if cachedNode(s, "sick").Degraded != 1 {
		t.Fatal("the cache missed the Degraded GPU")
	}
	if got := f.queue.list(); !slices.Equal(got, []string{"waiting"}) {
		t.Errorf("queued %v in all, want waiting once", got)
	}
}

func TestRequeueNodeNewToTheCache(t *testing.T) {
	f := startedRequeuing(t, nil, pod("waiting", "", scheduling.ResourceGPU, 1, nil))
	// The scheduler knows a node the extender's informer has not seen yet.
	res := filterOn(t, f.s, pod("waiting", "", scheduling.ResourceGPU, 1, nil), "new")
	if !strings.Contains(res.FailedNodes["new"], "not in the gpuhealth extender's cache") {
		t.Fatalf("FailedNodes = %v", res.FailedNodes)
	}
	if _, err := f.client.CoreV1().Nodes().Create(t.Context(), node("new", 8, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.advanceUntil(t, func() bool { return slices.Equal(f.patches.names(), []string{"waiting"}) })
}

func TestRequeuePatchFailures(t *testing.T) {
	gone := apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "gone")
	failures := map[string][]error{
		"gone":  {gone},
		"flaky": {errors.New("connection reset"), apierrors.NewServiceUnavailable("try again")},
	}
	f := startedRequeuing(t, failures,
		node("sick", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5,6,7"}),
		pod("gone", "", scheduling.ResourceGPU, 1, nil),
		pod("flaky", "", scheduling.ResourceGPU, 1, nil),
	)
	for _, name := range []string{"gone", "flaky"} {
		filterOn(t, f.s, pod(name, "", scheduling.ResourceGPU, 1, nil), "sick")
	}
	f.setUnhealthy(t, "sick", "")
	f.sync(t)
	if got := f.queue.list(); !slices.Equal(got, []string{"flaky", "gone"}) {
		t.Fatalf("queued %v, want flaky and gone", got)
	}
	// A failed patch is retried with backoff until it succeeds: 200 ms, then 400 ms later.
	f.advanceUntil(t, func() bool { return len(f.patches.of("flaky")) == 3 })
	tries := f.patches.of("flaky")
	for i, least := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond} {
		if gap := tries[i+1].at.Sub(tries[i].at); gap < least {
			t.Errorf("retry %d of flaky came %v after the try before, want at least %v", i+1, gap, least)
		}
	}
	// A pod that is gone is tried once and forgotten.
	waitFor(t, func() bool { return !isRemembered(f.s, "gone") })
	if n := len(f.patches.of("gone")); n != 1 {
		t.Errorf("gone: patched %d times, want once", n)
	}
	if got := f.queue.list(); !slices.Equal(got, []string{"flaky", "flaky", "flaky", "gone"}) {
		t.Errorf("queued %v, want flaky three times (two retries) and gone once", got)
	}
}

func TestRequeueMemoryIsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(requeueEpoch)
	r := newRequeuer(fake.NewClientset(), clk)
	uid := func(i int) types.UID { return types.UID(fmt.Sprintf("uid-%d", i)) }
	// size counts the pods remembered and the nodes some pod is remembered for.
	size := func() (pods, nodes int) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range r.byNode {
			if len(m) > 0 {
				nodes++
			}
		}
		return len(r.pods), nodes
	}

	t.Run("the latest filter call replaces the nodes", func(t *testing.T) {
		r.remember(uid(1), "default", "p", []string{"a", "b"})
		r.remember(uid(1), "default", "p", []string{"b"})
		if got := r.due("a"); len(got) != 0 {
			t.Errorf("due(a) = %v, want none", got)
		}
		if got := r.due("b"); !slices.Equal(got, []types.UID{uid(1)}) {
			t.Errorf("due(b) = %v, want [uid-1]", got)
		}
		r.remember(uid(1), "default", "p", nil) // fits now, or rejected for other reasons
		if pods, nodes := size(); pods != 0 || nodes != 0 || r.pairs != 0 {
			t.Errorf("after no nodes: %d pods, %d nodes, %d pairs; want none", pods, nodes, r.pairs)
		}
	})

	t.Run("bound pods are forgotten", func(t *testing.T) {
		r.remember(uid(1), "default", "p", []string{"a"})
		r.forget(uid(1))
		if pods, nodes := size(); pods != 0 || nodes != 0 {
			t.Errorf("after forget: %d pods, %d nodes", pods, nodes)
		}
	})

	t.Run("rejections expire", func(t *testing.T) {
		r.remember(uid(1), "default", "p", []string{"a"})
		clk.Step(rememberFor - time.Minute)
		// Rejected again on the same nodes (a parked pod's periodic retry): remembered anew.
		r.remember(uid(1), "default", "p", []string{"a"})
		clk.Step(2 * time.Minute)
		if got := r.due("a"); !slices.Equal(got, []types.UID{uid(1)}) {
			t.Errorf("due(a) = %v after a fresh rejection, want [uid-1]", got)
		}
		clk.Step(rememberFor)
		if got := r.due("a"); len(got) != 0 {
			t.Errorf("due(a) = %v after %v, want none", got, rememberFor)
		}
		// The next remember sweeps the expired one away.
		r.remember(uid(2), "default", "q", []string{"b"})
		if pods, _ := size(); pods != 1 {
			t.Errorf("%d pods remembered, want 1 (the expired one swept)", pods)
		}
		r.forget(uid(2))
	})

	t.Run("at most maxRemembered pairs", func(t *testing.T) {
		many := make([]string, maxRemembered)
		for i := range many {
			many[i] = fmt.Sprintf("node-%d", i)
		}
		r.remember(uid(1), "default", "p", many)
		r.remember(uid(2), "default", "q", []string{"node-0"})
		if got := r.due("node-0"); !slices.Equal(got, []types.UID{uid(1)}) {
			t.Errorf("due(node-0) = %v, want only the pod that fit in memory", got)
		}
		if r.pairs != maxRemembered {
			t.Errorf("%d pairs, want %d", r.pairs, maxRemembered)
		}
		// Once the first expires, there is room again.
		clk.Step(rememberFor)
		r.remember(uid(2), "default", "q", []string{"node-0"})
		if got := r.due("node-0"); !slices.Equal(got, []types.UID{uid(2)}) {
			t.Errorf("due(node-0) = %v, want [uid-2]", got)
		}
		if pods, nodes := size(); pods != 1 || nodes != 1 || r.pairs != 1 {
			t.Errorf("%d pods, %d nodes, %d pairs; want 1 each", pods, nodes, r.pairs)
		}
		// The sweep also drops the nodes no pod is remembered for any more.
		if len(r.byNode) != 1 {
			t.Errorf("%d nodes indexed after the sweep, want 1", len(r.byNode))
		}
	})
}
