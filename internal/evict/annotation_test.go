package evict

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// patches counts the patches of the Node that reached the (fake) API server.
func (r *rig) patches() int {
	n := 0
	for _, a := range r.client.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" {
			n++
		}
	}
	return n
}

// setAnnotation writes key=value on the Node as someone else would.
func (r *rig) setAnnotation(t *testing.T, key, value string) {
	t.Helper()
	ctx := context.Background()
	n, err := r.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n = n.DeepCopy()
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[key] = value
	if _, err := r.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) rawAnnotation(t *testing.T, key string) (string, bool) {
	t.Helper()
	n, err := r.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := n.Annotations[key]
	return v, ok
}

// TestThePendingListIsWrittenOnlyWhenTheNodeDiffers: the annotation is patched alone, when the
// Node lists something else (a previous agent's list is cleared, someone else's edit repaired)
// and never again for the same list.
func TestThePendingListIsWrittenOnlyWhenTheNodeDiffers(t *testing.T) {
	r := newRig(t, nil, nil, nil) // GPU-1111 asks for eviction; nobody holds it
	r.setAnnotation(t, gpuhealthv1.EvictionsKey, `{"GPU-9999":{"index":3,"pods":[{"pod":"ml/gone","via":"volcano","state":"Held"}]}}`)
	r.setAnnotation(t, "example.com/other", "kept")
	before := r.patches()
	ctx := context.Background()

	r.ev.Round(ctx)
	if v, ok := r.rawAnnotation(t, gpuhealthv1.EvictionsKey); ok || r.patches()-before != 1 {
		t.Fatalf("after the first round the annotation is %q (present %v) after %d patches; want it removed by one", v, ok, r.patches()-before)
	}
	if v, _ := r.rawAnnotation(t, "example.com/other"); v != "kept" {
		t.Errorf("another annotation became %q", v)
	}
	r.ev.Round(ctx)
	if n := r.patches() - before; n != 1 {
		t.Errorf("%d patches after a round with nothing new, want still 1", n)
	}
	r.setAnnotation(t, gpuhealthv1.EvictionsKey, "{garbage")
	r.ev.Round(ctx)
	if _, ok := r.rawAnnotation(t, gpuhealthv1.EvictionsKey); ok || r.patches()-before != 2 {
		t.Errorf("someone else's value survived a round (%d patches)", r.patches()-before)
	}
}

// TestSomeoneElsesChangeAsksForARound: with the Node's cache running, an edit of the annotation
// by someone else is repaired at once, not at the next retry (the fake clock never gets there).
func TestSomeoneElsesChangeAsksForARound(t *testing.T) {
	var nodes *nodecache.Cache
	r := newRig(t, []*corev1.Pod{pod("ml/a")}, map[string][]string{"ml/a": {"GPU-1111"}}, func(o *Options) {
		o.DryRun = true
		nodes = nodecache.New(o.Client, o.NodeName)
		o.Nodes = nodes
	})
	done := make(chan error, 1)
	go func() { done <- r.ev.Run(t.Context()) }()
	// t.Context ends before the cleanups run.
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		nodes.Shutdown()
	})
	waitForAnnotation(t, r, func(v string) bool { return v != "" })
	want, _ := r.rawAnnotation(t, gpuhealthv1.EvictionsKey)

	r.setAnnotation(t, gpuhealthv1.EvictionsKey, "")
	waitForAnnotation(t, r, func(v string) bool { return v == want })
}

func waitForAnnotation(t *testing.T, r *rig, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, _ := r.rawAnnotation(t, gpuhealthv1.EvictionsKey)
		if ok(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the annotation stayed %q", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
