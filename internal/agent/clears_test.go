package agent

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

var clearsT0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// clearFixture is an agent's view of a node with GPU-a (drained, XID 48 and XID 79), GPU-b
// (XID 48) and GPU-b's MIG instance MIG-b1 (an XID 109 of its own).
type clearFixture struct {
	w        *requestWatcher
	client   *fake.Clientset
	monitor  *health.Monitor
	recorder *record.FakeRecorder
	clock    *clocktesting.FakeClock
}

func newClearFixture(t *testing.T, clears string) *clearFixture {
	t.Helper()
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{
		{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1},
		{UUID: "MIG-b1", Index: 1, MIG: &health.MIGPlacement{ParentUUID: "GPU-b", GPUInstance: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	m.SetDrains(map[string]string{"GPU-a": "drained by bob: fan noise"}, clearsT0)
	m.Signal(health.XIDSignal("GPU-a", 48, clearsT0))
	m.Signal(health.XIDSignal("GPU-a", 79, clearsT0))
	m.Signal(health.XIDSignal("GPU-b", 48, clearsT0))
	m.Signal(health.Signal{Kind: health.SignalXID, Device: "GPU-b", Time: clearsT0, XID: 109, MIGScoped: true, GPUInstance: 1, ComputeInstance: health.NoInstance})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{"example.com/other": "keep"}}}
	if clears != "" {
		node.Annotations[gpuhealthv1.ClearsKey] = clears
	}
	client := fake.NewClientset(node)
	clk := clocktesting.NewFakeClock(clearsT0.Add(time.Minute))
	f := &clearFixture{client: client, monitor: m, recorder: record.NewFakeRecorder(100), clock: clk}
	nodeRef := &corev1.ObjectReference{Kind: "Node", Name: "n1"}
	f.w = &requestWatcher{
		nodes: nodecache.New(adapt.Clientset(client), "n1"), client: adapt.Clientset(client), clock: clk,
		recorder: f.recorder, nodeRef: nodeRef, memory: m, kind: clearRequests(m, clk, f.recorder, nodeRef),
	}
	return f
}

// reasons returns the reasons in effect on a device.
func (f *clearFixture) reasons(uuid string) []string {
	var out []string
	for _, c := range findDevice(f.monitor.Snapshot(), uuid).Conditions {
		out = append(out, c.Reason)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (f *clearFixture) annotations(t *testing.T) map[string]string {
	t.Helper()
	n, err := f.client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Annotations
}

func (f *clearFixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestClearWatcherAppliesEachRequestOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		clears string
		// want are the reasons left on GPU-a, GPU-b and MIG-b1.
		wantA, wantB, wantMIG []string
		// wantEvents are substrings of the Events, one for each, in order.
		wantEvents []string
	}{
		{
			name:   "one condition by its reason",
			clears: `{"GPU-a":[{"index":0,"condition":"XID79","reason":"loose cable, ticket 7","by":"alice","at":"2026-11-30T10:00:30Z"}]}`,
			wantA:  []string{"AdminDrain", "XID48"}, wantB: []string{"XID48"}, wantMIG: []string{"XID109", "XID48"},
			wantEvents: []string{"Normal GPUConditionsCleared gpuhealth cleared XID79 on GPU 0 (GPU-a), requested by alice at 2026-11-30T10:00:30Z: loose cable, ticket 7; now Unhealthy, still AdminDrain, XID48"},
		},
		{
			name:   "every condition but the drain",
			clears: `{"GPU-a":[{"index":0,"reason":"bad batch","by":"alice","at":"2026-11-30T10:00:30Z"}]}`,
			wantA:  []string{"AdminDrain"}, wantB: []string{"XID48"}, wantMIG: []string{"XID109", "XID48"},
			wantEvents: []string{"Normal GPUConditionsCleared gpuhealth cleared XID48, XID79 on GPU 0 (GPU-a), requested by alice at 2026-11-30T10:00:30Z: bad batch; now Unhealthy, still AdminDrain"},
		},
		{
			name:   "a GPU and its MIG instances",
			clears: `{"GPU-b":[{"index":1,"reason":"r","by":"alice","at":"2026-11-30T10:00:30Z"}]}`,
			wantA:  []string{"AdminDrain", "XID48", "XID79"}, wantB: nil, wantMIG: nil,
			wantEvents: []string{"cleared XID48, XID109 on GPU 1 (GPU-b), requested by alice at 2026-11-30T10:00:30Z: r; now Healthy"},
		},
		{
			name:   "by TYPE:CODE, a UUID in another case",
			clears: `{"gpu-a":[{"index":0,"condition":"xid:48","reason":"r","by":"alice","at":"2026-11-30T10:00:30Z"}]}`,
			wantA:  []string{"AdminDrain", "XID79"}, wantB: []string{"XID48"}, wantMIG: []string{"XID109", "XID48"},
			wantEvents: []string{"cleared XID48 on GPU 0 (GPU-a)"},
		},
		{
			name:   "nothing matches",
			clears: `{"GPU-b":[{"index":1,"condition":"UncorrectedECCErrors","reason":"r","by":"alice","at":"2026-11-30T10:00:30Z"}]}`,
			wantA:  []string{"AdminDrain", "XID48", "XID79"}, wantB: []string{"XID48"}, wantMIG: []string{"XID109", "XID48"},
			wantEvents: []string{"Warning GPUClearMatchedNothing gpuhealth cleared nothing on GPU 1 (GPU-b): no condition UncorrectedECCErrors in effect (in effect: XID48); requested by alice at 2026-11-30T10:00:30Z: r"},
		},
		{
			name:   "only a drain in effect",
			clears: `{"GPU-a":[{"index":0,"condition":"XID","reason":"r","by":"alice","at":"2026-11-30T10:00:30Z"},{"index":0,"reason":"again","by":"alice","at":"2026-11-30T10:00:30Z"}]}`,
			wantA:  []string{"AdminDrain"}, wantB: []string{"XID48"}, wantMIG: []string{"XID109", "XID48"},
			wantEvents: []string{"cleared XID48, XID79 on GPU 0", "Warning GPUClearMatchedNothing gpuhealth cleared nothing on GPU 0 (GPU-a): no condition to clear in effect (in effect: AdminDrain); gpuhealth undrain ends a drain"},
		},
		{
			name:   "a GPU this node does not have, then one it has",
			clears: `{"GPU-gone":[{"index":5,"condition":"XID48","reason":"r","by":"alice","at":"2026-11-30T10:00:30Z"}],"GPU-b":[{"index":1,"condition":"XID48","reason":"r","by":"alice","at":"2026-11-30T10:00:30Z"}]}`,
			wantA:  []string{"AdminDrain", "XID48", "XID79"}, wantB: nil, wantMIG: []string{"XID109"},
			wantEvents: []string{"cleared XID48 on GPU 1 (GPU-b)", "Warning GPUClearMatchedNothing gpuhealth cleared nothing: this node has no GPU GPU-gone"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newClearFixture(t, tc.clears)
			ctx := klog.NewContext(context.Background(), klog.Background())
			if err := f.w.sync(ctx); err != nil {
				t.Fatal(err)
			}
			for uuid, want := range map[string][]string{"GPU-a": tc.wantA, "GPU-b": tc.wantB, "MIG-b1": tc.wantMIG} {
				if got := f.reasons(uuid); !slices.Equal(got, want) {
					t.Errorf("%s: reasons %v, want %v", uuid, got, want)
				}
			}
			events := f.events()
			if len(events) != len(tc.wantEvents) {
				t.Errorf("events %q, want %d like %q", events, len(tc.wantEvents), tc.wantEvents)
			}
			for i := range min(len(events), len(tc.wantEvents)) {
				if !strings.Contains(events[i], tc.wantEvents[i]) {
					t.Errorf("event %d %q does not say %q", i, events[i], tc.wantEvents[i])
				}
			}
			ann := f.annotations(t)
			if _, ok := ann[gpuhealthv1.ClearsKey]; ok || ann["example.com/other"] != "keep" {
				t.Errorf("annotations after the requests were applied: %v; want %s removed and nothing else", ann, gpuhealthv1.ClearsKey)
			}
			// Applied and removed: another sync, as after a restart, applies nothing.
			if err := f.w.sync(ctx); err != nil {
				t.Fatal(err)
			}
			if again := f.events(); len(again) != 0 {
				t.Errorf("a second sync sent %q", again)
			}
		})
	}
}

// A cleared condition that returns is raised again, as any other.
func TestClearedConditionReturns(t *testing.T) {
	f := newClearFixture(t, `{"GPU-b":[{"index":1,"condition":"XID48","reason":"r","by":"alice","at":"2026-11-30T10:00:30Z"}]}`)
	ctx := context.Background()
	if err := f.w.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := findDevice(f.monitor.Snapshot(), "GPU-b").Health; got != health.Healthy {
		t.Fatalf("GPU-b is %v after the clear, want Healthy", got)
	}
	f.monitor.Signal(health.XIDSignal("GPU-b", 48, clearsT0.Add(2*time.Minute)))
	if got := f.reasons("GPU-b"); !slices.Equal(got, []string{"XID48"}) {
		t.Errorf("after the XID returned GPU-b has %v, want XID48 again", got)
	}
}

// A malformed annotation: a Warning once, nothing applied, nothing removed.
func TestClearWatcherLeavesAMalformedAnnotation(t *testing.T) {
	bad := `{"GPU-a":[{"condition":"XID79","reason":"r"}],"GPU-b":[{"condition":"XID 48","reason":"r"}]}`
	f := newClearFixture(t, bad)
	ctx := context.Background()
	for range 2 {
		if err := f.w.sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if events := f.events(); len(events) != 1 || !strings.Contains(events[0], "Warning MalformedClears gpuhealth applied none of the clear requests") {
		t.Errorf("events %q, want one MalformedClears Warning", events)
	}
	if got := f.reasons("GPU-a"); !slices.Equal(got, []string{"AdminDrain", "XID48", "XID79"}) {
		t.Errorf("GPU-a has %v: something was applied from a malformed annotation", got)
	}
	if got := f.annotations(t)[gpuhealthv1.ClearsKey]; got != bad {
		t.Errorf("the malformed annotation is now %q", got)
	}
}

// A removal that fails is tried again without applying the requests again; a request added
// before the removal succeeds is applied too, and nothing is lost.
func TestClearWatcherRetriesTheRemoval(t *testing.T) {
	first := `{"GPU-a":[{"index":0,"condition":"XID79","reason":"first","by":"alice","at":"2026-11-30T10:00:30Z"}]}`
	f := newClearFixture(t, first)
	fails := 1
	f.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fails > 0 {
			fails--
			return true, nil, errors.New("the API server is away")
		}
		return false, nil, nil
	})
	ctx := context.Background()
	if err := f.w.sync(ctx); err == nil {
		t.Fatal("sync succeeded although the removal failed")
	}
	if f.annotations(t)[gpuhealthv1.ClearsKey] != first {
		t.Fatal("the request is gone although the removal failed")
	}
	// An operator adds a request meanwhile: the next removal's test sees the new value.
	second := `{"GPU-a":[{"index":0,"condition":"XID79","reason":"first","by":"alice","at":"2026-11-30T10:00:30Z"},{"index":0,"condition":"XID48","reason":"second","by":"carol","at":"2026-11-30T10:00:30Z"}]}`
	n, err := f.client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Annotations[gpuhealthv1.ClearsKey] = second
	if _, err := f.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The removal of the value first read fails its test; nothing is lost.
	if err := f.w.remove(ctx, first); err == nil {
		t.Fatal("removing a value that changed succeeded")
	}
	if f.annotations(t)[gpuhealthv1.ClearsKey] != second {
		t.Fatal("a request added meanwhile was lost")
	}
	if err := f.w.sync(ctx); err != nil {
		t.Fatal(err)
	}
	events := f.events()
	if len(events) != 2 || !strings.Contains(events[0], "cleared XID79") || !strings.Contains(events[1], "cleared XID48") || !strings.Contains(events[1], "carol") {
		t.Errorf("events %q, want XID79 cleared once and then XID48 for carol", events)
	}
	if _, ok := f.annotations(t)[gpuhealthv1.ClearsKey]; ok {
		t.Error("the requests are still on the Node")
	}
}

// run follows the Node: a request written while it runs is applied and removed, and a refused
// removal is tried again on the clock.
func TestClearWatcherRun(t *testing.T) {
	f := newClearFixture(t, "")
	refusals := 1
	f.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetPatchType() == "application/json-patch+json" && refusals > 0 {
			refusals--
			return true, nil, errors.New("the API server is away")
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.w.run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		f.w.nodes.Shutdown()
	}()
	body := `{"metadata":{"annotations":{"` + gpuhealthv1.ClearsKey + `":"{\"GPU-b\":[{\"index\":1,\"condition\":\"XID48\",\"reason\":\"r\",\"by\":\"alice\",\"at\":\"2026-11-30T10:00:30Z\"}]}"}}}`
	if _, err := f.client.CoreV1().Nodes().Patch(ctx, "n1", "application/merge-patch+json", []byte(body), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	healthtest.Eventually(t, "the request applied", func() bool { return findDevice(f.monitor.Snapshot(), "GPU-b").Health == health.Healthy })
	// The first removal was refused: the watcher waits a second on its clock and tries again.
	healthtest.Eventually(t, "the retry's timer", func() bool { return f.clock.HasWaiters() })
	f.clock.Step(clearRetryFirst)
	healthtest.Eventually(t, "the request removed", func() bool {
		n, err := f.client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		_, pending := n.Annotations[gpuhealthv1.ClearsKey]
		return err == nil && !pending
	})
	if events := f.events(); len(events) != 1 || !strings.Contains(events[0], "GPUConditionsCleared") {
		t.Errorf("events %q, want the request applied once", events)
	}
}

// A request ends only conditions that began by the time it was written: a fault raised after it
// (a request left in a manifest, or written while the agent was down) stays, and the Event says
// why.
func TestClearLeavesConditionsRaisedAfterTheRequest(t *testing.T) {
	f := newClearFixture(t, `{"GPU-b":[{"index":1,"condition":"XID48","reason":"old ticket","by":"alice","at":"2026-11-30T09:59:00Z"}]}`)
	if err := f.w.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.reasons("GPU-b"); !slices.Equal(got, []string{"XID48"}) {
		t.Errorf("GPU-b has %v, want XID48 kept: it began after the request", got)
	}
	events := f.events()
	if len(events) != 1 || !strings.Contains(events[0], "Warning GPUClearMatchedNothing gpuhealth cleared nothing on GPU 1 (GPU-b)") ||
		!strings.Contains(events[0], "XID48 raised after the request was written (2026-11-30T09:59:00Z)") {
		t.Errorf("events %q, want one Warning naming XID48 as raised after the request", events)
	}
}

// A request the agent may not remove is not applied again by the next process: the checkpoint
// remembers it.
func TestClearAppliedOnceAcrossRestarts(t *testing.T) {
	f := newClearFixture(t, `{"GPU-a":[{"index":0,"condition":"XID79","reason":"r","by":"alice","at":"2026-11-30T10:00:30Z"}]}`)
	f.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "n1", errors.New("an older admission policy"))
	})
	ctx := context.Background()
	if err := f.w.sync(ctx); err == nil {
		t.Fatal("sync succeeded although the removal was refused")
	}
	if events := f.events(); len(events) != 2 || !strings.Contains(events[0], "cleared XID79") || !strings.Contains(events[1], "does not apply them again after a restart") {
		t.Fatalf("events %q, want the clear and the refused removal", events)
	}

	// The agent restarts: a new process restores the checkpoint the first one wrote.
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := health.WriteCheckpoint(path, f.monitor.Tracker().Checkpoint()); err != nil {
		t.Fatal(err)
	}
	cp, err := health.ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}})
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	if err := m.Restore(cp, "boot-1", clearsT0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	restarted := &requestWatcher{nodes: nodecache.New(adapt.Clientset(f.client), "n1"), client: adapt.Clientset(f.client), memory: m,
		clock: f.clock, recorder: f.recorder, nodeRef: f.w.nodeRef, kind: clearRequests(m, f.clock, f.recorder, f.w.nodeRef)}
	_ = restarted.sync(ctx) // the removal is still refused
	for _, e := range f.events() {
		if strings.Contains(e, "Cleared") || strings.Contains(e, "cleared") {
			t.Errorf("the restarted agent applied the request again: %q", e)
		}
	}
}
