package nodecondition_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func withCondition(d health.DeviceStatus, c health.Condition) health.DeviceStatus {
	d.Conditions = append(d.Conditions, c)
	d.Health = max(d.Health, c.Severity)
	return d
}

func TestRebootDesired(t *testing.T) {
	failed := health.Condition{Type: "Remediation", Severity: health.Unhealthy, Reason: "RemediationFailed", Message: "gave up after 3 resets", RecommendedAction: health.ActionRebootNode}
	offBus := health.Condition{Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, Reason: "XID79", Message: "fell off the bus", RecommendedAction: health.ActionRebootNode}
	degradedReboot := health.Condition{Type: health.ConditionXID, Severity: health.Degraded, Reason: "X", RecommendedAction: health.ActionRebootNode}
	for _, tc := range []struct {
		name              string
		devs              []health.DeviceStatus
		status            corev1.ConditionStatus
		reason, wantInMsg string
	}{
		{"healthy", []health.DeviceStatus{device(0, health.Healthy, "")}, corev1.ConditionFalse, "NoRebootRequired", ""},
		{"reset-class fault", []health.DeviceStatus{device(0, health.Unhealthy, "XID48")}, corev1.ConditionFalse, "NoRebootRequired", ""},
		{"degraded asking for a reboot", []health.DeviceStatus{withCondition(device(0, health.Healthy, ""), degradedReboot)}, corev1.ConditionFalse, "NoRebootRequired", ""},
		{"fault that needs a reboot", []health.DeviceStatus{withCondition(device(1, health.Healthy, ""), offBus)}, corev1.ConditionTrue, "RebootRecommended", "1 (GPU-b): fell off the bus"},
		{"remediation gave up", []health.DeviceStatus{withCondition(device(1, health.Healthy, ""), offBus), withCondition(device(2, health.Unhealthy, "XID48"), failed)}, corev1.ConditionTrue, "RemediationFailed", "2 (GPU-c): gave up after 3 resets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, reason, msg := nodecondition.RebootDesired(health.Snapshot{Devices: tc.devs})
			if status != tc.status || reason != tc.reason || !strings.Contains(msg, tc.wantInMsg) {
				t.Errorf("RebootDesired = %s, %s, %q; want %s, %s, containing %q", status, reason, msg, tc.status, tc.reason, tc.wantInMsg)
			}
		})
	}
}

func TestSyncWritesTheRebootConditionOnlyWhenAsked(t *testing.T) {
	ctx := context.Background()
	snap := health.Snapshot{Devices: []health.DeviceStatus{device(0, health.Unhealthy, "XID48")}}
	for _, on := range []bool{false, true} {
		client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
		s := nodecondition.New(adapt.Clientset(client), "n1", nodecondition.Options{Clock: clocktesting.NewFakePassiveClock(time.Unix(1000, 0)), RebootRequired: on})
		if _, err := s.Sync(ctx, snap); err != nil {
			t.Fatal(err)
		}
		node, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, c := range node.Status.Conditions {
			if c.Type == nodecondition.RebootType {
				found = c.Status == corev1.ConditionFalse && c.Reason == "NoRebootRequired"
			}
		}
		if found != on {
			t.Errorf("RebootRequired=%v: conditions %+v", on, node.Status.Conditions)
		}
	}
}
