package extender

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// TestBindReleasesItsLocks fails a bind on every path that holds the bind lock and checks that no
// path, not even a panic from the client, leaves it (or the state's lock) held: the next bind
// would wait forever.
func TestBindReleasesItsLocks(t *testing.T) {
	health := `{"GPU-card0":{"index":0,"health":"Healthy"}}`
	tests := []struct {
		name      string
		node      string
		memory    int64
		patch     func() error // the client's answer to recording the card
		wantError string
		wantPanic bool
	}{
		{name: "node not in the cache", node: "missing", memory: 1000, wantError: "not in the gpuhealth extender's cache"},
		{name: "no card has room", node: "share", memory: 20000, wantError: "more than a card's 16000 MiB"},
		{name: "recording the card fails", node: "share", memory: 1000, patch: func() error { return errors.New("connection reset") }, wantError: "connection reset"},
		{name: "the client panics", node: "share", memory: 1000, patch: func() error { panic("client bug") }, wantPanic: true},
		{name: "bound", node: "share", memory: 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, client := started(t, Options{Bind: true},
				sharingNode("share", 1, 16000, map[string]string{gpuhealthv1.HealthKey: health}),
				pod("p", "", scheduling.ResourceGPUMemory, tc.memory, nil))
			if tc.patch != nil {
				client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.patch()
				})
			}
			var err error
			panicked := func() (panicked bool) {
				defer func() { panicked = recover() != nil }()
				err = s.Bind(t.Context(), &extenderv1.ExtenderBindingArgs{PodName: "p", PodNamespace: "default", Node: tc.node})
				return false
			}()
			if panicked != tc.wantPanic {
				t.Fatalf("panicked = %v, want %v", panicked, tc.wantPanic)
			}
			switch {
			case tc.wantPanic:
			case tc.wantError == "" && err != nil:
				t.Fatalf("Bind: %v", err)
			case tc.wantError != "" && (err == nil || !strings.Contains(err.Error(), tc.wantError)):
				t.Fatalf("Bind: %v, want an error containing %q", err, tc.wantError)
			}
			if !s.bindMu.TryLock() {
				t.Fatal("Bind left the bind lock held")
			}
			s.bindMu.Unlock()
			if !s.state.mu.TryLock() {
				t.Fatal("Bind left the state locked")
			}
			s.state.mu.Unlock()
		})
	}
}

func TestBindSharedCard(t *testing.T) {
	health := `{"GPU-card0":{"index":0,"health":"Healthy"},"GPU-card1":{"index":1,"health":"Healthy"},"GPU-card2":{"index":2,"health":"Unhealthy"}}`
	s, client := started(t, Options{Bind: true},
		sharingNode("share", 3, 16000, map[string]string{gpuhealthv1.HealthKey: health}),
		pod("running", "share", scheduling.ResourceGPUMemory, 10000, map[string]string{scheduling.GPUIndexAnnotation: "1"}),
		pod("a", "", scheduling.ResourceGPUMemory, 4000, nil),
		pod("b", "", scheduling.ResourceGPUMemory, 8000, nil),
		pod("c", "", scheduling.ResourceGPUMemory, 9000, nil),
	)
	bind := func(name string) extenderv1.ExtenderBindingResult {
		rec := post(t, s.Handler(), "/bind", extenderv1.ExtenderBindingArgs{PodName: name, PodNamespace: "default", PodUID: types.UID("uid-" + name), Node: "share"})
		var res extenderv1.ExtenderBindingResult
		decodeInto(t, rec, &res)
		return res
	}
	card := func(name string) (string, string) {
		p, err := client.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Annotations[scheduling.GPUIndexAnnotation], p.Annotations[scheduling.GPUUUIDAnnotation]
	}
	// a packs onto card 1 (10000 of 16000 used), not the empty card 0 nor the unhealthy card 2.
	if res := bind("a"); res.Error != "" {
		t.Fatalf("bind a: %s", res.Error)
	}
	if idx, uuid := card("a"); idx != "1" || uuid != "GPU-card1" {
		t.Errorf("a got card %q (%q), want 1 (GPU-card1)", idx, uuid)
	}
	// b no longer fits card 1 (charged at once, before any informer event): card 0.
	if res := bind("b"); res.Error != "" {
		t.Fatalf("bind b: %s", res.Error)
	}
	if idx, uuid := card("b"); idx != "0" || uuid != "GPU-card0" {
		t.Errorf("b got card %q (%q), want 0 (GPU-card0)", idx, uuid)
	}
	// c fits no healthy card.
	if res := bind("c"); !strings.Contains(res.Error, "no healthy GPU has 9000 MiB free") {
		t.Errorf("bind c: error %q, want no room", res.Error)
	}
	var bindings []string
	for _, a := range client.Actions() {
		if ca, ok := a.(k8stesting.CreateAction); ok && a.GetSubresource() == "binding" {
			b := ca.GetObject().(*corev1.Binding)
			bindings = append(bindings, b.Name+"->"+b.Target.Name)
		}
	}
	if strings.Join(bindings, ",") != "a->share,b->share" {
		t.Errorf("bindings = %v, want a and b on share", bindings)
	}
	// A stale UID is refused.
	rec := post(t, s.Handler(), "/bind", extenderv1.ExtenderBindingArgs{PodName: "c", PodNamespace: "default", PodUID: "other", Node: "share"})
	var res extenderv1.ExtenderBindingResult
	decodeInto(t, rec, &res)
	if !strings.Contains(res.Error, "is now UID") {
		t.Errorf("stale UID: error %q", res.Error)
	}
}

func TestBindWholeGPUs(t *testing.T) {
	s, client := started(t, Options{Bind: true}, node("n", 8, nil), pod("p", "", scheduling.ResourceGPU, 2, nil))
	if err := s.Bind(t.Context(), &extenderv1.ExtenderBindingArgs{PodName: "p", PodNamespace: "default", Node: "n"}); err != nil {
		t.Fatal(err)
	}
	p, err := client.CoreV1().Pods("default").Get(t.Context(), "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Annotations[scheduling.GPUIndexAnnotation]; ok {
		t.Errorf("whole-GPU pod got a card annotation: %v", p.Annotations)
	}
	var u scheduling.Usage
	s.state.read(func(v view) { u = v.usage("n") })
	if u.GPUs != 2 {
		t.Errorf("usage after bind = %+v, want 2 GPUs charged", u)
	}
}

// TestBindRefusesWhatTheSchedulerWouldNotAsk: /bind binds with the extender's own pods/binding
// right, so anyone who can reach it must not be able to bind any pod anywhere: a pod that is
// bound, not pending, being deleted or of another scheduler is refused, as is a node that does
// not pass the filter now (sick GPUs, or a report gone stale since the filter); nothing is bound.
func TestBindRefusesWhatTheSchedulerWouldNotAsk(t *testing.T) {
	sick := `{"GPU-n-0":{"index":0,"health":"Unhealthy"},"GPU-n-1":{"index":1,"health":"Unhealthy"}}`
	bound := pod("bound", "n", scheduling.ResourceGPU, 1, nil)
	done := pod("done", "", scheduling.ResourceGPU, 1, nil)
	done.Status.Phase = corev1.PodSucceeded
	other := pod("other", "", scheduling.ResourceGPU, 1, nil)
	other.Spec.SchedulerName = "volcano"
	deleting := pod("deleting", "", scheduling.ResourceGPU, 1, nil)
	now := metav1.Now()
	deleting.DeletionTimestamp, deleting.Finalizers = &now, []string{"x"}
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	stale := node("stale", 8, map[string]string{gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(at.Add(-time.Hour))})
	s, client := started(t, Options{Bind: true, StaleAfter: 15 * time.Minute, Clock: clocktesting.NewFakeClock(at)},
		node("n", 8, nil), node("sick", 2, map[string]string{gpuhealthv1.HealthKey: sick}), stale,
		bound, done, other, deleting, pod("fine", "", scheduling.ResourceGPU, 1, nil))
	for _, tc := range []struct{ pod, node, want string }{
		{"bound", "n", "already bound to n"},
		{"done", "n", "is Succeeded, not Pending"},
		{"other", "n", `asks for scheduler "volcano"; this extender serves default-scheduler`},
		{"deleting", "n", "is being deleted"},
		{"fine", "sick", "node sick does not pass the filter now"},
		{"fine", "stale", "node stale does not pass the filter now: the gpuhealth report of this node is stale since 2026-12-03T11:00:00Z"},
	} {
		err := s.Bind(t.Context(), &extenderv1.ExtenderBindingArgs{PodName: tc.pod, PodNamespace: "default", Node: tc.node})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bind %s to %s: %v, want refused: %s", tc.pod, tc.node, err, tc.want)
		}
	}
	for _, a := range client.Actions() {
		if a.GetSubresource() == "binding" {
			t.Errorf("bound although refused: %v", a)
		}
	}
	// The scheduler's own request goes through.
	if err := s.Bind(t.Context(), &extenderv1.ExtenderBindingArgs{PodName: "fine", PodNamespace: "default", Node: "n"}); err != nil {
		t.Fatal(err)
	}
}
