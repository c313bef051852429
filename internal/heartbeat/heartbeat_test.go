package heartbeat

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

func TestRenewerCreatesAndRenewsItsLease(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	client := fake.NewClientset()
	renewed := make(chan time.Time, 10)
	r := &Renewer{Client: adapt.Clientset(client), Namespace: "ns", Node: "node-1", Period: time.Minute, StaleAfter: 3 * time.Minute, Clock: clk,
		Jitter:  func(d time.Duration) time.Duration { return d },
		Renewed: func(at time.Time) { renewed <- at }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	get := func() *coordinationv1.Lease {
		l, err := client.CoordinationV1().Leases("ns").Get(ctx, gpuhealthv1.HeartbeatLeaseName("node-1"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	healthtest.Eventually(t, "the first renewal at once", func() bool { return clk.HasWaiters() && len(renewed) == 1 })
	first := get()
	if !first.Spec.RenewTime.Time.Equal(t0) || *first.Spec.HolderIdentity != "node-1" || *first.Spec.LeaseDurationSeconds != 180 ||
		first.Labels[gpuhealthv1.HeartbeatLeaseLabel] != "true" {
		t.Fatalf("first Lease %+v", first)
	}
	client.ClearActions()
	clk.Step(time.Minute)
	healthtest.Eventually(t, "the renewal a period later", func() bool { return len(renewed) == 2 })
	// One request a renewal: the Lease the last write returned is updated, not read again.
	var verbs []string
	for _, a := range client.Actions() {
		verbs = append(verbs, a.GetVerb())
	}
	if strings.Join(verbs, ",") != "update" {
		t.Errorf("a renewal sent %v, want one update", verbs)
	}
	if l := get(); !l.Spec.RenewTime.Time.Equal(t0.Add(time.Minute)) || !l.Spec.AcquireTime.Time.Equal(t0) {
		t.Errorf("renewed Lease %+v", l.Spec)
	}
	// Deleted by someone: made again at the next renewal.
	if err := client.CoordinationV1().Leases("ns").Delete(ctx, gpuhealthv1.HeartbeatLeaseName("node-1"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	healthtest.Eventually(t, "waiting for the next period", func() bool { return clk.HasWaiters() })
	clk.Step(time.Minute)
	healthtest.Eventually(t, "the Lease made again", func() bool { return len(renewed) == 3 })
	if l := get(); !l.Spec.RenewTime.Time.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("Lease made again %+v", l.Spec)
	}
}

func TestJudge(t *testing.T) {
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	lease := func(holder string, renewed time.Time) *coordinationv1.Lease {
		l := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder)}}
		if !renewed.IsZero() {
			l.Spec.RenewTime = &metav1.MicroTime{Time: renewed}
		}
		return l
	}
	oldAnnotation := map[string]string{gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(now.Add(-time.Hour))}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		lease       *coordinationv1.Lease
		stale       bool
		why         string
	}{
		{"a fresh Lease wins over an old annotation", oldAnnotation, lease("n", now.Add(-time.Minute)), false, ""},
		{"a stale Lease", nil, lease("n", now.Add(-time.Hour)), true, "stale since"},
		{"a Lease far in the future", nil, lease("n", now.Add(time.Hour)), true, "in the future"},
		{"a Lease of another holder", nil, lease("m", now), true, "not renewed by the node's agent"},
		{"a Lease never renewed", nil, lease("n", time.Time{}), true, "not renewed by the node's agent"},
		{"no Lease: an earlier release's annotation", oldAnnotation, nil, true, "stale since"},
		{"no Lease, no annotation: no agent to judge", nil, nil, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Judge("n", tc.annotations, tc.lease, now, 15*time.Minute)
			if s.Stale != tc.stale || tc.why != "" && !strings.Contains(s.Describe(now), tc.why) {
				t.Errorf("Judge = %+v (%s), want stale %v saying %q", s, s.Describe(now), tc.stale, tc.why)
			}
		})
	}
}

func TestLeaseNames(t *testing.T) {
	if got := gpuhealthv1.HeartbeatLeaseName("gpu-node-7"); got != "gpuhealth-heartbeat-gpu-node-7" {
		t.Errorf("HeartbeatLeaseName = %q", got)
	}
	long := strings.Repeat("a", 250)
	got := gpuhealthv1.HeartbeatLeaseName(long)
	if len(got) > 253 || !strings.HasPrefix(got, "gpuhealth-heartbeat-") || got == gpuhealthv1.HeartbeatLeaseName(long+"b") {
		t.Errorf("HeartbeatLeaseName of a 250-character node = %q", got)
	}
}
