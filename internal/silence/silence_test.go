package silence

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func TestJudge(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	beat := func(at time.Time) map[string]string {
		return map[string]string{gpuhealthv1.HealthKey: "{}", gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(at)}
	}
	silentCondition := []corev1.NodeCondition{{Type: conditionType, Status: corev1.ConditionUnknown, Reason: gpuhealthv1.ReasonAgentSilent}}
	for _, tc := range []struct {
		name       string
		ann        map[string]string
		conditions []corev1.NodeCondition
		hadBeat    bool
		want       verdict
	}{
		{"fresh", beat(now.Add(-time.Minute)), nil, false, verdict{judged: true, recheck: 14*time.Minute + time.Second}},
		{"stale", beat(now.Add(-time.Hour)), nil, false, verdict{judged: true, silent: true, why: "its last heartbeat was at 2026-12-06T11:00:00Z (stale after 15m0s)"}},
		{"far in the future", beat(now.Add(2 * time.Hour)), nil, false, verdict{judged: true, silent: true, why: "its heartbeat is in the future (2026-12-06T14:00:00Z)"}},
		{"a little ahead", beat(now.Add(time.Minute)), nil, false, verdict{judged: true, recheck: 16*time.Minute + time.Second}},
		{"unreadable", map[string]string{gpuhealthv1.HeartbeatKey: "yesterday"}, nil, false,
			verdict{judged: true, silent: true, why: `its heartbeat cannot be read (gpuhealth.dev/gpu-health-heartbeat: parsing time "yesterday" as "2006-01-02T15:04:05Z07:00": cannot parse "yesterday" as "2006")`}},
		{"removed after one was seen", map[string]string{gpuhealthv1.HealthKey: "{}"}, nil, true,
			verdict{judged: true, silent: true, why: "its heartbeat (Lease gpuhealth-heartbeat-n, or annotation gpuhealth.dev/gpu-health-heartbeat) was removed"}},
		{"removed, marked before a restart", map[string]string{gpuhealthv1.HealthKey: "{}"}, silentCondition, false,
			verdict{judged: true, silent: true, why: "its heartbeat (Lease gpuhealth-heartbeat-n, or annotation gpuhealth.dev/gpu-health-heartbeat) was removed"}},
		{"an agent older than heartbeats", map[string]string{gpuhealthv1.HealthKey: "{}"}, nil, false, verdict{}},
		{"no agent", nil, nil, false, verdict{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &Watcher{opts: Options{StaleAfter: gpuhealthv1.DefaultStaleAfter}, hadBeat: map[string]bool{"n": tc.hadBeat}, silent: map[string]bool{}}
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: tc.ann}, Status: corev1.NodeStatus{Conditions: tc.conditions}}
			if got := w.judge(n, now); got != tc.want {
				t.Errorf("judge = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestJudgedNodeKeepsOnlyWhatIsRead(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{gpuhealthv1.HealthKey: `{"big":"report"}`, gpuhealthv1.HeartbeatKey: "t", "other": "x"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "other"}, {Key: gpuhealthv1.AgentSilentTaintKey, Effect: corev1.TaintEffectNoSchedule}}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: "Ready"}, {Type: conditionType}}},
	}
	got := judgedNode(n).(*corev1.Node)
	if len(got.Annotations) != 2 || got.Annotations[gpuhealthv1.HealthKey] != "" || got.Annotations[gpuhealthv1.HeartbeatKey] != "t" ||
		len(got.Spec.Taints) != 1 || !hasTaint(got) || len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Type != conditionType {
		t.Errorf("judgedNode kept %+v", got)
	}
}

// TestAnAgentThatRewritesItsConditionIsNotFought: an agent that is alive but cannot renew its
// heartbeat repairs its condition at once; the Watcher marks the node again at most once per
// StaleAfter, so that the two do not write the Node in turn without end.
func TestAnAgentThatRewritesItsConditionIsNotFought(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(now)
	stale := gpuhealthv1.FormatHeartbeat(now.Add(-time.Hour))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{gpuhealthv1.HealthKey: "{}", gpuhealthv1.HeartbeatKey: stale}}}
	client := fake.NewClientset(node)
	w, err := New(Options{Client: adapt.Clientset(client), StaleAfter: 15 * time.Minute, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	agentRewrites := func() {
		t.Helper()
		n, err := client.CoreV1().Nodes().Get(context.Background(), "n", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: conditionType, Status: corev1.ConditionFalse, Reason: gpuhealthv1.ReasonGPUsHealthy}}
		if _, err := client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := store.Update(judgedNode(n)); err != nil {
			t.Fatal(err)
		}
	}
	patches := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "patch" {
				n++
			}
		}
		return n
	}
	if err := store.Add(judgedNode(node)); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := w.reconcile(context.Background(), store, "n"); err != nil {
			t.Fatal(err)
		}
		if i < 4 {
			agentRewrites()
		}
	}
	if got := patches(); got != 1 {
		t.Errorf("the Watcher patched the condition %d times while the agent rewrote it, want once per StaleAfter (1)", got)
	}
	clk.Step(15 * time.Minute)
	if _, err := w.reconcile(context.Background(), store, "n"); err != nil {
		t.Fatal(err)
	}
	if got := patches(); got != 2 {
		t.Errorf("after StaleAfter the Watcher patched %d times in all, want 2", got)
	}
}
