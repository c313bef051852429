package nodecache_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
)

func node(rv, value string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: rv, Annotations: map[string]string{"k": value}}}
}

// countGets counts the GETs that reach the (fake) API server.
func countGets(client *fake.Clientset) *int {
	n := new(int)
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		*n++
		return false, nil, nil
	})
	return n
}

func waitFor(t *testing.T, c *nodecache.Cache, value string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := c.Get(t.Context())
		if err == nil && n.Annotations["k"] == value {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Get never returned k=%q (last %v, %v)", value, n, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestGetReturnsTheNewerOfTheCacheAndOurWrite(t *testing.T) {
	client := fake.NewClientset(node("10", "start"))
	gets := countGets(client)
	c := nodecache.New(adapt.Clientset(client), "n1")
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	n, err := c.Get(t.Context())
	if err != nil || n.Annotations["k"] != "start" {
		t.Fatalf("Get = %v, %v; want the cached node", n, err)
	}

	// Our write returned a newer object than the informer holds: Get must not go back.
	c.Wrote(node("12", "ours"))
	if n, _ := c.Get(t.Context()); n.Annotations["k"] != "ours" {
		t.Errorf("after our write Get = %q, want %q", n.Annotations["k"], "ours")
	}
	// An older response (a slow write racing a faster one) never replaces a newer one.
	c.Wrote(node("11", "older"))
	if n, _ := c.Get(t.Context()); n.Annotations["k"] != "ours" {
		t.Errorf("after an older response Get = %q, want %q", n.Annotations["k"], "ours")
	}

	// Someone else writes after us: the informer's newer copy wins.
	if _, err := client.CoreV1().Nodes().Update(t.Context(), node("15", "theirs"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, "theirs")
	if *gets != 0 {
		t.Errorf("%d GETs reached the API server, want 0: every read had an answer in memory", *gets)
	}
}

func TestGetAsksTheAPIServerWhenItCannotTell(t *testing.T) {
	ctx := context.Background()
	t.Run("not started", func(t *testing.T) {
		client := fake.NewClientset(node("10", "live"))
		gets := countGets(client)
		n, err := nodecache.New(adapt.Clientset(client), "n1").Get(ctx)
		if err != nil || n.Annotations["k"] != "live" || *gets != 1 {
			t.Errorf("Get = %v, %v after %d GETs; want the live node after one", n, err, *gets)
		}
	})
	t.Run("resource versions that do not compare", func(t *testing.T) {
		client := fake.NewClientset(node("10", "live"))
		c := nodecache.New(adapt.Clientset(client), "n1")
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		gets := countGets(client)
		c.Wrote(node("not-a-number", "ours"))
		n, err := c.Get(ctx)
		if err != nil || *gets != 1 || n.Annotations["k"] != "live" {
			t.Errorf("Get = %v, %v after %d GETs; want the live node after one", n, err, *gets)
		}
	})
	t.Run("node not in the cache", func(t *testing.T) {
		client := fake.NewClientset()
		c := nodecache.New(adapt.Clientset(client), "n1")
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get(ctx); err == nil {
			t.Error("Get of a node that does not exist succeeded")
		}
	})
	t.Run("a write for another node is ignored", func(t *testing.T) {
		client := fake.NewClientset(node("10", "start"))
		c := nodecache.New(adapt.Clientset(client), "n1")
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		other := node("99", "other")
		other.Name = "n2"
		c.Wrote(other)
		c.Wrote(nil)
		if n, _ := c.Get(ctx); n.Annotations["k"] != "start" {
			t.Errorf("Get = %q, want %q", n.Annotations["k"], "start")
		}
	})
}

func TestWaitCaughtUpReturnsOnceTheInformerHasOurWrite(t *testing.T) {
	client := fake.NewClientset(node("10", "start"))
	c := nodecache.New(adapt.Clientset(client), "n1")
	// Before Start there is nothing to wait for.
	c.Wrote(node("12", "ours"))
	c.WaitCaughtUp(t.Context())
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}

	// Our write (resource version 12) has not reached the informer (10): the wait holds until
	// the watch delivers it, and ends when the context does.
	short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	c.WaitCaughtUp(short)
	if short.Err() == nil {
		t.Fatal("WaitCaughtUp returned before the informer had our write")
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		c.WaitCaughtUp(t.Context())
	}()
	select {
	case <-done:
		t.Fatal("WaitCaughtUp returned before the informer had our write")
	case <-time.After(20 * time.Millisecond):
	}
	if _, err := client.CoreV1().Nodes().Update(t.Context(), node("12", "ours"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("WaitCaughtUp did not return after the informer got our write")
	}
}
