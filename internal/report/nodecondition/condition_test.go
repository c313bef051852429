package nodecondition_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func device(i int, h health.Severity, reason string) health.DeviceStatus {
	d := health.DeviceStatus{Device: health.Device{UUID: "GPU-" + string(rune('a'+i)), Index: i}, Health: h}
	if h != health.Healthy {
		d.Conditions = []health.Condition{{Type: health.ConditionXID, Severity: h, Reason: reason}}
	}
	return d
}

func TestDesired(t *testing.T) {
	for _, tc := range []struct {
		name       string
		devs       []health.DeviceStatus
		wantStatus corev1.ConditionStatus
		wantReason string
		wantInMsg  string
	}{
		{"healthy", []health.DeviceStatus{device(0, health.Healthy, ""), device(1, health.Healthy, "")}, corev1.ConditionFalse, nodecondition.ReasonHealthy, "all 2 GPUs are healthy"},
		{"degraded only", []health.DeviceStatus{device(0, health.Degraded, "ClocksThrottled"), device(1, health.Healthy, "")}, corev1.ConditionFalse, nodecondition.ReasonDegraded, "1 of 2 GPUs degraded: 0 (GPU-a): ClocksThrottled"},
		{"unhealthy", []health.DeviceStatus{device(0, health.Degraded, "ClocksThrottled"), device(1, health.Unhealthy, "XID79")}, corev1.ConditionTrue, nodecondition.ReasonUnhealthy, "1 of 2 GPUs unhealthy: 1 (GPU-b): XID79"},
		{"software suspected", []health.DeviceStatus{device(0, health.Healthy, ""), device(1, health.Healthy, "")}, corev1.ConditionFalse, health.ReasonXIDSpreadOverGPU, "node: XIDSpreadOverGPUs: XID 13 seen on 2 GPUs"},
		{"software suspected beside a sick GPU", []health.DeviceStatus{device(0, health.Healthy, ""), device(1, health.Unhealthy, "XID79")}, corev1.ConditionTrue, nodecondition.ReasonUnhealthy, "1 of 2 GPUs unhealthy: 1 (GPU-b): XID79. node: XIDSpreadOverGPUs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := health.Snapshot{Devices: tc.devs}
			if strings.HasPrefix(tc.name, "software") {
				snap.Findings = []health.NodeFinding{{Reason: health.ReasonXIDSpreadOverGPU, Message: "XID 13 seen on 2 GPUs within 10m0s: software", GPUs: []string{"GPU-a", "GPU-b"}}}
			}
			status, reason, msg := nodecondition.Desired(snap)
			if status != tc.wantStatus || reason != tc.wantReason || !strings.Contains(msg, tc.wantInMsg) {
				t.Errorf("Desired = %s, %s, %q; want %s, %s, containing %q", status, reason, msg, tc.wantStatus, tc.wantReason, tc.wantInMsg)
			}
		})
	}
}

func TestSyncKeepsOtherConditionsAndTransitionTimes(t *testing.T) {
	ctx := context.Background()
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}})
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	s := nodecondition.New(adapt.Clientset(client), "n1", nodecondition.Options{Clock: clk})

	sync := func(devs ...health.DeviceStatus) int {
		t.Helper()
		n, err := s.Sync(ctx, health.Snapshot{Devices: devs})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	get := func() (corev1.NodeCondition, int) {
		t.Helper()
		node, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var c corev1.NodeCondition
		for _, x := range node.Status.Conditions {
			if x.Type == nodecondition.Type {
				c = x
			}
		}
		return c, len(node.Status.Conditions)
	}
	if n := sync(device(0, health.Unhealthy, "XID79")); n != 1 {
		t.Fatalf("first sync wrote %d times, want 1", n)
	}
	c, count := get()
	if c.Status != corev1.ConditionTrue || count != 2 {
		t.Fatalf("condition %+v with %d conditions, want True next to Ready", c, count)
	}
	firstTransition := c.LastTransitionTime
	clk.SetTime(time.Unix(2000, 0))
	if n := sync(device(0, health.Unhealthy, "XID79")); n != 0 {
		t.Errorf("unchanged state wrote %d times, want 0", n)
	}
	if n := sync(device(0, health.Unhealthy, "XID48")); n != 1 {
		t.Errorf("new message wrote %d times, want 1", n)
	}
	c, _ = get()
	if !c.LastTransitionTime.Equal(&firstTransition) {
		t.Errorf("lastTransitionTime moved from %v to %v without a status change", firstTransition, c.LastTransitionTime)
	}
}

// heldBreaker holds back the GPUs in held.
type heldBreaker struct{ held []string }

func (b *heldBreaker) Held() []string { return b.held }

func TestSyncKeepsTheCircuitBreakerConditionWithABreaker(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	cb := &heldBreaker{held: []string{"GPU-a", "GPU-b"}}
	s := nodecondition.New(adapt.Clientset(client), "n1", nodecondition.Options{Clock: clocktesting.NewFakePassiveClock(time.Unix(1000, 0)), Breaker: cb})
	breakerCondition := func() corev1.NodeCondition {
		t.Helper()
		node, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range node.Status.Conditions {
			if c.Type == nodecondition.BreakerType {
				return c
			}
		}
		t.Fatalf("no %s condition in %+v", nodecondition.BreakerType, node.Status.Conditions)
		return corev1.NodeCondition{}
	}
	snap := health.Snapshot{Devices: []health.DeviceStatus{device(0, health.Unhealthy, "XID79"), device(1, health.Unhealthy, "XID79")}}
	if n, err := s.Sync(ctx, snap); err != nil || n != 1 {
		t.Fatalf("Sync = %d, %v; want 1 write", n, err)
	}
	if c := breakerCondition(); c.Status != corev1.ConditionTrue || c.Reason != "CircuitBreakerOpen" || !strings.Contains(c.Message, "GPU-a, GPU-b") {
		t.Errorf("breaker condition %+v, want True naming GPU-a and GPU-b", c)
	}
	cb.held = nil
	if n, err := s.Sync(ctx, snap); err != nil || n != 1 {
		t.Fatalf("Sync after the breaker let the GPUs through = %d, %v; want 1 write", n, err)
	}
	if c := breakerCondition(); c.Status != corev1.ConditionFalse || c.Reason != "CircuitBreakerClosed" {
		t.Errorf("breaker condition %+v, want False", c)
	}
}

func TestEventsPerTransition(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	e := nodecondition.NewEvents(rec, "n1", "")
	dev := health.Device{UUID: "GPU-a", Index: 2}
	e.Record(health.Transition{Device: dev, From: health.Healthy, To: health.Unhealthy, Reason: "XID79"})
	e.Record(health.Transition{Device: dev, From: health.Unhealthy, To: health.Healthy, Reason: "NodeReboot"})
	for _, want := range []string{"Warning GPUUnhealthy GPU 2 (GPU-a): Healthy -> Unhealthy: XID79", "Normal GPURecovered GPU 2 (GPU-a): Unhealthy -> Healthy: NodeReboot"} {
		if got := <-rec.Events; got != want {
			t.Errorf("event %q, want %q", got, want)
		}
	}
}

// TestNoWriteWithoutAChange: the heartbeat is a Lease now; the syncer writes the condition once
// and then nothing while nothing changes, however much time passes, and never a heartbeat
// annotation.
func TestNoWriteWithoutAChange(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(t0)
	s := nodecondition.New(adapt.Clientset(client), "n1", nodecondition.Options{Clock: clk})
	snap := health.Snapshot{Devices: []health.DeviceStatus{device(0, health.Healthy, "")}}
	for i, step := range []time.Duration{0, 5 * time.Minute, time.Hour} {
		clk.SetTime(t0.Add(step))
		want := 0
		if i == 0 {
			want = 1
		}
		if n, err := s.Sync(ctx, snap); err != nil || n != want {
			t.Fatalf("Sync at +%v = %d, %v; want %d writes", step, n, err, want)
		}
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := node.Annotations[gpuhealthv1.HeartbeatKey]; ok {
		t.Errorf("the syncer wrote a heartbeat annotation %q", v)
	}
}
