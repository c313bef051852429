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
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// patchLog records the pod patches the requeuer makes, in order.
type patchLog struct {
	mu      sync.Mutex
	names   []string
	patches map[string][]byte
}

func (l *patchLog) record(name string, patch []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names = append(l.names, name)
	if l.patches == nil {
		l.patches = map[string][]byte{}
	}
	l.patches[name] = patch
}

func (l *patchLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.names)
}

// startedRequeuing is started with Requeue on; it records every pod patch (failed ones too) and
// answers the patches of the pods in failures with the errors given there, in turn.
func startedRequeuing(t *testing.T, failures map[string][]error, objs ...runtime.Object) (*Server, *fake.Clientset, *patchLog) {
	t.Helper()
	client := fake.NewClientset(objs...)
	log := &patchLog{}
	var mu sync.Mutex
	client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		log.record(pa.GetName(), pa.GetPatch())
		mu.Lock()
		defer mu.Unlock()
		if errs := failures[pa.GetName()]; len(errs) > 0 {
			failures[pa.GetName()] = errs[1:]
			return true, nil, errs[0]
		}
		return false, nil, nil
	})
	s := New(client, Options{Bind: true, Requeue: true})
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s, client, log
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
func setUnhealthy(t *testing.T, s *Server, client *fake.Clientset, n, ids string) {
	t.Helper()
	var ann map[string]string
	if ids != "" {
		ann = map[string]string{gpuhealthv1.UnhealthyIDsKey: ids}
	}
	if _, err := client.CoreV1().Nodes().Update(t.Context(), node(n, 8, ann), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := 0
	if ids != "" {
		want = len(strings.Split(ids, ","))
	}
	waitFor(t, func() bool { return cachedNode(s, n) != nil && cachedNode(s, n).Unhealthy == want })
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

// settle gives a patch that should not happen the time to happen: nudges wait 100 ms in the
// queue, and a wrong one would have been queued before the one just seen.
func settle() { time.Sleep(300 * time.Millisecond) }

func TestRequeueAfterRecovery(t *testing.T) {
	gpuPod := func(name string) *corev1.Pod { return pod(name, "", scheduling.ResourceGPU, 4, nil) }
	s, client, log := startedRequeuing(t, nil,
		node("sick", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5"}), // 2 free
		node("busy", 8, nil), // 0 free: a running pod holds all 8
		node("free", 8, nil),
		node("cpu", 0, nil),
		pod("running", "busy", scheduling.ResourceGPU, 8, nil),
		gpuPod("waiting"), gpuPod("other"), gpuPod("bound-elsewhere"), gpuPod("bound-by-us"),
	)

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
	if _, err := client.CoreV1().Pods("default").Update(t.Context(), bound, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(t.Context(), &extenderv1.ExtenderBindingArgs{PodName: "bound-by-us", PodNamespace: "default", Node: "free"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !isRemembered(s, "bound-elsewhere") && !isRemembered(s, "bound-by-us") })

	// Worse is not better: another GPU fails.
	setUnhealthy(t, s, client, "sick", "0,1,2,3,4,5,6")
	// Recovery.
	setUnhealthy(t, s, client, "sick", "")
	waitFor(t, func() bool { return len(log.list()) > 0 })
	settle()
	if got := log.list(); !slices.Equal(got, []string{"waiting"}) {
		t.Fatalf("patched %v, want only waiting", got)
	}
	var patch struct {
		Metadata struct {
			UID         types.UID
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(log.patches["waiting"], &patch); err != nil {
		t.Fatal(err)
	}
	if patch.Metadata.UID != "uid-waiting" {
		t.Errorf("patch carries UID %q, want uid-waiting", patch.Metadata.UID)
	}
	p, err := client.CoreV1().Pods("default").Get(t.Context(), "waiting", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := time.Parse(time.RFC3339Nano, p.Annotations[RequeuedAtAnnotation]); err != nil {
		t.Errorf("%s = %q: %v", RequeuedAtAnnotation, p.Annotations[RequeuedAtAnnotation], err)
	}

	// Updates that do not free GPUs requeue nothing more: the same health again, a Degraded GPU.
	setUnhealthy(t, s, client, "sick", "")
	if _, err := client.CoreV1().Nodes().Update(t.Context(), node("sick", 8, map[string]string{gpuhealthv1.HealthKey: `{"GPU-0":{"index":0,"health":"Degraded"}}`}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return cachedNode(s, "sick").Degraded == 1 })
	settle()
	if got := log.list(); len(got) != 1 {
		t.Errorf("patched %v, want waiting once", got)
	}
}

func TestRequeueNodeNewToTheCache(t *testing.T) {
	s, client, log := startedRequeuing(t, nil, pod("waiting", "", scheduling.ResourceGPU, 1, nil))
	// The scheduler knows a node the extender's informer has not seen yet.
	res := filterOn(t, s, pod("waiting", "", scheduling.ResourceGPU, 1, nil), "new")
	if !strings.Contains(res.FailedNodes["new"], "not in the gpuhealth extender's cache") {
		t.Fatalf("FailedNodes = %v", res.FailedNodes)
	}
	if _, err := client.CoreV1().Nodes().Create(t.Context(), node("new", 8, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return slices.Equal(log.list(), []string{"waiting"}) })
}

func TestRequeuePatchFailures(t *testing.T) {
	gone := apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "gone")
	failures := map[string][]error{
		"gone":  {gone},
		"flaky": {errors.New("connection reset"), apierrors.NewServiceUnavailable("try again")},
	}
	s, client, log := startedRequeuing(t, failures,
		node("sick", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5,6,7"}),
		pod("gone", "", scheduling.ResourceGPU, 1, nil),
		pod("flaky", "", scheduling.ResourceGPU, 1, nil),
	)
	for _, name := range []string{"gone", "flaky"} {
		filterOn(t, s, pod(name, "", scheduling.ResourceGPU, 1, nil), "sick")
	}
	setUnhealthy(t, s, client, "sick", "")
	count := func(name string) int {
		n := 0
		for _, got := range log.list() {
			if got == name {
				n++
			}
		}
		return n
	}
	// A failed patch is retried with backoff until it succeeds.
	waitFor(t, func() bool { return count("flaky") == 3 })
	// A pod that is gone is tried once and forgotten.
	settle()
	if n := count("gone"); n != 1 || isRemembered(s, "gone") {
		t.Errorf("gone: patched %d times, remembered %v; want once, then forgotten", n, isRemembered(s, "gone"))
	}
	if n := count("flaky"); n != 3 {
		t.Errorf("flaky: patched %d times, want 3", n)
	}
}

func TestRequeueMemoryIsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
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

func TestImproved(t *testing.T) {
	parse := func(gpus int64, ann map[string]string) *scheduling.NodeGPUs {
		n, _ := scheduling.ParseNode(node("n", gpus, ann))
		return &n
	}
	unhealthy := func(ids string) map[string]string { return map[string]string{gpuhealthv1.UnhealthyIDsKey: ids} }
	tests := []struct {
		name       string
		prev, next *scheduling.NodeGPUs
		want       bool
	}{
		{"new to the cache", nil, parse(8, nil), true},
		{"unchanged", parse(8, unhealthy("0,1")), parse(8, unhealthy("0,1")), false},
		{"a GPU recovers", parse(8, unhealthy("0,1")), parse(8, unhealthy("1")), true},
		{"one recovers, another fails", parse(8, unhealthy("0")), parse(8, unhealthy("1")), true},
		{"a GPU fails", parse(8, unhealthy("0")), parse(8, unhealthy("0,1")), false},
		{"undrained", parse(8, map[string]string{gpuhealthv1.DrainsKey: `{"GPU-a":{"index":2}}`}), parse(8, nil), true},
		{"a GPU turns Degraded", parse(8, nil), parse(8, map[string]string{gpuhealthv1.HealthKey: `{"GPU-0":{"index":0,"health":"Degraded"}}`}), false},
		{"Unhealthy to Degraded", parse(8, unhealthy("0")), parse(8, map[string]string{gpuhealthv1.HealthKey: `{"GPU-0":{"index":0,"health":"Degraded"}}`}), true},
		{"more GPUs", parse(4, nil), parse(8, nil), true},
		{"fewer GPUs", parse(8, nil), parse(4, nil), false},
		{"the recovered GPU is gone", parse(8, unhealthy("7")), parse(4, nil), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := improved(tc.prev, tc.next); got != tc.want {
				t.Errorf("improved = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHealthBlocks(t *testing.T) {
	health := func(ids string) map[string]string { return map[string]string{gpuhealthv1.UnhealthyIDsKey: ids} }
	whole := func(n int64) scheduling.Request { return scheduling.Request{GPUs: n} }
	tests := []struct {
		name string
		req  scheduling.Request
		node *corev1.Node
		used scheduling.Usage
		want bool
	}{
		{"unhealthy GPUs are in the way", whole(4), node("n", 8, health("0,1,2,3,4,5")), scheduling.Usage{}, true},
		{"unhealthy GPUs and pods are in the way", whole(4), node("n", 8, health("0,1,2,3")), scheduling.Usage{GPUs: 3}, true},
		{"pods alone are in the way", whole(4), node("n", 8, health("0")), scheduling.Usage{GPUs: 6}, false},
		{"the node is too small", whole(16), node("n", 8, health("0")), scheduling.Usage{}, false},
		{"no GPUs", whole(1), node("n", 0, nil), scheduling.Usage{}, false},
		{"an unhealthy shared card", scheduling.Request{MemoryMiB: 8000}, sharingNode("n", 2, 16000, health("0")), scheduling.Usage{CardMemory: map[int]int64{1: 10000}}, true},
		{"the request is larger than a card", scheduling.Request{MemoryMiB: 20000}, sharingNode("n", 2, 16000, health("0")), scheduling.Usage{}, false},
	}
	var scratch []scheduling.GPU
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, _ := scheduling.ParseNode(tc.node)
			if fits, _ := scheduling.Filter(tc.req, &n, tc.used); fits {
				t.Fatal("the request fits; healthBlocks is only asked about requests that do not")
			}
			if got := healthBlocks(tc.req, &n, tc.used, &scratch); got != tc.want {
				t.Errorf("healthBlocks = %v, want %v", got, tc.want)
			}
		})
	}
}
