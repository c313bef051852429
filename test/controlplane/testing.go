package controlplane

import (
	"context"
	"testing"
	"time"
)

// logTailLines is how much of each component's log a failing test prints.
const logTailLines = 60

// StartT starts a control plane for a test (or benchmark) and stops it when the test ends. If
// the test failed, it first dumps the cluster's objects and the tail of every component's log
// (see DumpOnFailure). Start-up progress goes to the test log; errors fail the test at once.
func StartT(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Progress == nil {
		opts.Progress = func(msg string) { t.Log("controlplane: " + msg) }
	}
	c, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() && c.removeDir {
			// Keep the full logs for whoever debugs the failure.
			c.removeDir = false
			t.Logf("control-plane logs and kubeconfigs kept in %s", c.Dir())
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	c.DumpOnFailure(t)
	return c
}

// DumpOnFailure registers a cleanup on t that, if t has failed by then, writes the cluster's
// objects (Dump) and the tail of every component's log to the test output. StartT does this for
// its own test; call it from each test when several tests share a cluster started in TestMain.
func (c *Cluster) DumpOnFailure(t testing.TB) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// t.Context() is already cancelled while cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		w := t.Output()
		if err := c.Dump(ctx, w); err != nil {
			t.Logf("dump cluster objects: %v", err)
		}
		c.WriteLogTails(w, logTailLines)
	})
}

// StartKubeletT starts a FakeKubelet for node and stops it when the test ends; errors fail the
// test.
func (c *Cluster) StartKubeletT(t testing.TB, node string) *FakeKubelet {
	t.Helper()
	k, err := c.StartKubelet(t.Context(), node)
	if err != nil {
		t.Fatalf("start fake kubelet: %v", err)
	}
	t.Cleanup(k.Stop)
	return k
}
