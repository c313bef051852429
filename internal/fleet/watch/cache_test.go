package watch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// jobPod is a running pod of job-1 on node, on card index.
func jobPod(node string, index int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("job-1-%s-%d", node, index), Namespace: "default",
			Annotations: map[string]string{"scheduling.k8s.io/group-name": "job-1", gpuhealthv1.PodGPUIndexKey: fmt.Sprint(index)}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func otherPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PodSpec{NodeName: "node-00"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func TestPodCacheKeepsOnlyWorkloadPods(t *testing.T) {
	c := newPodCache()
	if _, synced := c.list(); synced {
		t.Error("synced before the first list")
	}
	// The streamed initial list comes through transform: every other pod is one placeholder.
	a, _ := c.transform(jobPod("node-01", 7))
	b, _ := c.transform(otherPod("web-1"))
	d, _ := c.transform(otherPod("web-2"))
	if b != d || b != any(c.none) {
		t.Errorf("pods of no workload transformed to %v and %v, want the one placeholder", b, d)
	}
	if _, err := cache.MetaNamespaceKeyFunc(b); err != nil {
		t.Errorf("the placeholder has no key for client-go's stores: %v", err)
	}
	if err := c.Replace([]any{a, b, d, jobPod("node-03", 7)}, "1"); err != nil { // transformed and raw alike
		t.Fatal(err)
	}
	pods, synced := c.list()
	if !synced || len(pods) != 2 {
		t.Fatalf("after the list: %+v (synced %v), want the two job pods", pods, synced)
	}
	if err := c.Add(otherPod("web-3")); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(jobPod("node-05", 7)); err != nil {
		t.Fatal(err)
	}
	// A pod that no longer names its card is left out; a deleted one, or one whose delete was
	// missed, too.
	lost := jobPod("node-01", 7)
	delete(lost.Annotations, gpuhealthv1.PodGPUIndexKey)
	if err := c.Update(lost); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(jobPod("node-03", 7)); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(cache.DeletedFinalStateUnknown{Key: "default/job-1-node-05-7"}); err != nil {
		t.Fatal(err)
	}
	if pods, _ := c.list(); len(pods) != 0 {
		t.Errorf("left: %+v, want none", pods)
	}
	if err := c.Add(jobPod("node-07", 3)); err != nil {
		t.Fatal(err)
	}
	pods, _ = c.list()
	if want := (fleet.WorkloadPod{Workload: "podgroup/default/job-1", Node: "node-07", Cards: []int{3}}); len(pods) != 1 ||
		pods[0].Workload != want.Workload || pods[0].Node != want.Node || !slices.Equal(pods[0].Cards, want.Cards) {
		t.Errorf("kept %+v, want %+v", pods, want)
	}
}

// runFixture runs a Watcher on a fake clientset holding objs, with a fake clock stepped by step.
type runFixture struct {
	*fixture
	clk  *clocktesting.FakeClock
	done chan error
}

func startRun(t *testing.T, ctx context.Context, reactor k8stesting.ReactionFunc, objs ...runtime.Object) *runFixture {
	t.Helper()
	client := fake.NewClientset(objs...)
	if reactor != nil {
		client.PrependReactor("list", "pods", reactor)
	}
	clk := clocktesting.NewFakeClock(t0)
	f := &fixture{client: client, recorder: record.NewFakeRecorder(100), series: map[string]bool{}}
	w, err := New(Options{Client: adapt.Clientset(client), Namespace: testNamespace, Recorder: f.recorder, Clock: clk,
		Finding: func(attribute, value string, current bool) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.series[attribute+"="+value] = current
			if !current {
				delete(f.series, attribute+"="+value)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	f.w = w
	r := &runFixture{fixture: f, clk: clk, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	return r
}

// until steps the clock a period at a time until cond holds.
func (r *runFixture) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		if cond() {
			return true, nil
		}
		if r.clk.HasWaiters() {
			r.clk.Step(time.Minute)
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func (r *runFixture) verdict(t *testing.T) (Findings, bool) {
	cm, err := r.client.CoreV1().ConfigMaps(testNamespace).Get(t.Context(), ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return Findings{}, false
	}
	f, err := ParseFindings(cm)
	return f, err == nil
}

// TestRunReadsTheCluster: Run judges what the Nodes and pods say, and again when they change.
func TestRunReadsTheCluster(t *testing.T) {
	var objs []runtime.Object
	for _, n := range testFleet(t, driverAWave(t0)...) {
		objs = append(objs, n)
	}
	for i := range 4 {
		objs = append(objs, jobPod(fmt.Sprintf("node-%02d", 1+2*i), 7), otherPod(fmt.Sprintf("web-%d", i)))
	}
	ctx, cancel := context.WithCancel(t.Context())
	r := startRun(t, ctx, nil, objs...)
	var events []string // the Events come after the ConfigMap is written
	r.until(t, "driver A's finding and its Event", func() bool {
		f, ok := r.verdict(t)
		events = append(events, r.events()...)
		return ok && len(f.SharedCauses) == 1 && f.SharedCauses[0].Value == driverA && !f.WorkloadsUnknown && len(events) > 0
	})
	if len(events) != 1 || !strings.Contains(events[0], EventSharedCause) {
		t.Errorf("events %q, want driver A's", events)
	}
	for _, n := range testFleet(t) {
		if _, err := r.client.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	events = nil
	r.until(t, "driver A's finding gone, and its Event", func() bool {
		f, ok := r.verdict(t)
		events = append(events, r.events()...)
		return ok && len(f.SharedCauses) == 0 && len(events) > 0
	})
	if len(events) != 1 || !strings.Contains(events[0], EventSharedCauseGone) {
		t.Errorf("events %q, want the Gone Event", events)
	}
	cancel()
	if err := <-r.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if s := r.seriesNow(); len(s) != 0 {
		t.Errorf("series after Run returned: %v", s)
	}
}

// TestRunWithoutPods: pods that may not be listed leave the judgement without workloads, logged
// once however many periods pass; once they may, the workloads count again.
func TestRunWithoutPods(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
	defer cancel()
	var forbidden atomic.Bool
	forbidden.Store(true)
	var asked atomic.Int32
	reactor := func(k8stesting.Action) (bool, runtime.Object, error) {
		asked.Add(1)
		if forbidden.Load() {
			return true, nil, apierrors.NewForbidden(corev1.Resource("pods"), "", errors.New("no pods for you"))
		}
		return false, nil, nil
	}
	objs := []runtime.Object{jobPod("node-01", 7)}
	for _, n := range testFleet(t) {
		objs = append(objs, n)
	}
	r := startRun(t, ctx, reactor, objs...)
	r.until(t, "three judgements without workloads", func() bool {
		f, ok := r.verdict(t)
		return ok && f.WorkloadsUnknown && asked.Load() >= 3
	})
	buf := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if n := strings.Count(buf, "judging the fleet without workloads"); n != 1 {
		t.Errorf("the warning was logged %d times, want once:\n%s", n, buf)
	}
	forbidden.Store(false)
	r.until(t, "a judgement with workloads", func() bool {
		f, ok := r.verdict(t)
		return ok && !f.WorkloadsUnknown
	})
}
