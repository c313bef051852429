package controller

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/utils/ptr"
)

// testElection is the breaker controller's election on a fake clientset, as the replica "me".
func testElection(client *fake.Clientset) leaderelection.LeaderElectionConfig {
	return election(client, "ns", "me", leaderelection.NewLeaderHealthzAdaptor(time.Second))
}

// elect runs runLeaderElected in a goroutine; the channel has its result.
func elect(ctx context.Context, cfg leaderelection.LeaderElectionConfig, run func(context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- runLeaderElected(ctx, cfg, run) }()
	return done
}

// contestedLease returns a fake clientset and take, which makes "other" the holder of the
// breaker's Lease, renewed now. From then on the clientset refuses updates of the Lease by "me"
// with a conflict, as the API server refuses the stale resourceVersion of a replica that has not
// seen the change (the fake clientset does not check resourceVersions).
func contestedLease(t *testing.T) (client *fake.Clientset, take func()) {
	t.Helper()
	client = fake.NewClientset()
	var taken atomic.Bool
	// Reactors must be in place before the clientset is used: adding one is not goroutine-safe.
	client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		lease, ok := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if taken.Load() && ok && ptr.Deref(lease.Spec.HolderIdentity, "") == "me" {
			return true, nil, apierrors.NewConflict(coordinationv1.Resource("leases"), lease.Name, errors.New("held by other"))
		}
		return false, nil, nil
	})
	take = func() {
		t.Helper()
		taken.Store(true)
		leases := client.CoordinationV1().Leases("ns")
		lease, err := leases.Get(t.Context(), LeaderElectionLease, metav1.GetOptions{})
		if err != nil {
			lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: LeaderElectionLease}}
		}
		lease.Spec = coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To("other"),
			LeaseDurationSeconds: ptr.To[int32](60),
			AcquireTime:          &metav1.MicroTime{Time: time.Now()},
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		}
		if err == nil {
			_, err = leases.Update(t.Context(), lease, metav1.UpdateOptions{})
		} else {
			_, err = leases.Create(t.Context(), lease, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return client, take
}

func TestRunLeaderElectedWaitsForTheLeadingWork(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	leading, returned := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	boom := errors.New("counter failed while stopping")
	done := elect(ctx, testElection(fake.NewClientset()), func(ctx context.Context) error {
		close(leading)
		<-ctx.Done()
		select { // winding down outlasts the lead
		case <-returned:
		case <-time.After(200 * time.Millisecond):
		}
		finished.Store(true)
		return boom
	})
	<-leading
	cancel()
	err := <-done
	close(returned)
	if !finished.Load() {
		t.Error("runLeaderElected returned before the leading work finished")
	}
	if !errors.Is(err, boom) {
		t.Errorf("runLeaderElected: %v, want the leading work's error", err)
	}
}

func TestRunLeaderElectedReturnsTheWorksError(t *testing.T) {
	boom := errors.New("cannot count")
	err := <-elect(t.Context(), testElection(fake.NewClientset()), func(context.Context) error { return boom })
	if !errors.Is(err, boom) {
		t.Errorf("runLeaderElected: %v, want %v", err, boom)
	}
}

func TestRunLeaderElectedLosesTheLead(t *testing.T) {
	client, take := contestedLease(t)
	cfg := testElection(client)
	// Short enough for a test: the lead is lost 400 ms after another replica took the Lease.
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 600*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
	leading := make(chan struct{})
	var finished atomic.Bool
	done := elect(t.Context(), cfg, func(ctx context.Context) error {
		close(leading)
		<-ctx.Done()
		finished.Store(true)
		return nil
	})
	<-leading
	take()
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "lost the lead") {
		t.Errorf("runLeaderElected after another replica took the Lease: %v, want lost the lead", err)
	}
	if !finished.Load() {
		t.Error("runLeaderElected returned before the leading work finished")
	}
}

func TestRunLeaderElectedNeverLeading(t *testing.T) {
	client, take := contestedLease(t)
	take()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var ran atomic.Bool
	done := elect(ctx, testElection(client), func(context.Context) error {
		ran.Store(true)
		return nil
	})
	// Give up once the replica has seen the Lease held by another.
	for !triedLease(client) {
		select {
		case err := <-done:
			t.Fatalf("runLeaderElected returned %v before campaigning", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("runLeaderElected when the context ends before leading: %v, want nil", err)
	}
	if ran.Load() {
		t.Error("the work ran without the lead")
	}
}

// triedLease reports whether the client has been asked for the breaker's Lease.
func triedLease(client *fake.Clientset) bool {
	for _, a := range client.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "leases" && a.GetNamespace() == "ns" {
			return true
		}
	}
	return false
}
