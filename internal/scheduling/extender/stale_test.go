package extender

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// TestStaleReportsGetNoGPUPods: a node whose agent stopped confirming its report (heartbeat
// older than StaleAfter, or unreadable) fails the filter for GPU pods, saying since when; pods
// without GPUs still go there; a node of an agent without heartbeats, or with StaleAfter 0, is
// judged as before; the gauges count the stale nodes; a heartbeat again makes the node usable.
func TestStaleReportsGetNoGPUPods(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	beat := func(ago time.Duration) map[string]string {
		return map[string]string{gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(now.Add(-ago))}
	}
	nodes := []*corev1.Node{
		node("fresh", 8, beat(5*time.Minute)),
		node("stale", 8, beat(20*time.Minute)),
		node("garbage", 8, map[string]string{gpuhealthv1.HeartbeatKey: "soon"}),
		node("old-agent", 8, nil),
	}
	for _, tc := range []struct {
		name       string
		staleAfter time.Duration
		pod        *corev1.Pod
		wantFailed []string
	}{
		{"GPU pod", 15 * time.Minute, pod("p", "", scheduling.ResourceGPU, 1, nil), []string{"garbage", "stale"}},
		{"CPU pod", 15 * time.Minute, pod("p", "", corev1.ResourceCPU, 1, nil), nil},
		{"staleness off", 0, pod("p", "", scheduling.ResourceGPU, 1, nil), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := started(t, Options{StaleAfter: tc.staleAfter, Clock: clocktesting.NewFakeClock(now)}, nodes[0], nodes[1], nodes[2], nodes[3])
			res := filterOn(t, s, tc.pod, "fresh", "stale", "garbage", "old-agent")
			if len(res.FailedNodes) != len(tc.wantFailed) {
				t.Fatalf("failed %v, want %v", res.FailedNodes, tc.wantFailed)
			}
			for _, n := range tc.wantFailed {
				if !strings.Contains(res.FailedNodes[n], "stale") {
					t.Errorf("%s: reason %q does not say the report is stale", n, res.FailedNodes[n])
				}
			}
			if why := res.FailedNodes["stale"]; why != "" && !strings.Contains(why, "since 2026-12-02T11:40:00Z") {
				t.Errorf("reason %q does not say since when", why)
			}
			// The same verdict through the request path kube-scheduler uses (names in the body).
			names := []string{"fresh", "stale", "garbage", "old-agent"}
			reply := post(t, s.Handler(), "/filter", extenderv1.ExtenderArgs{Pod: tc.pod, NodeNames: &names}).Body.String()
			for _, n := range tc.wantFailed {
				if !strings.Contains(reply, `"`+n+`":"the gpuhealth report of this node is stale`) {
					t.Errorf("the named-node path passes %s: %s", n, reply)
				}
			}
			if tc.name == "GPU pod" {
				rec := httptest.NewRecorder()
				s.Handler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil))
				for _, want := range []string{"gpuhealth_extender_stale_nodes 2", "gpuhealth_extender_oldest_heartbeat_age_seconds 1200"} {
					if !strings.Contains(rec.Body.String(), "\n"+want+"\n") {
						t.Errorf("/metrics lacks %q", want)
					}
				}
			}
		})
	}
}

// TestAHeartbeatAgainIsAnImprovement: a stale node that reports again is worth retrying pods
// for (the requeuer hears of it); a heartbeat of a node that was fresh is not.
func TestAHeartbeatAgainIsAnImprovement(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s := New(nil, Options{StaleAfter: 15 * time.Minute, Clock: clocktesting.NewFakeClock(now)})
	set := func(name string, ago time.Duration) bool {
		_, better := s.state.setNode(node(name, 8, map[string]string{gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(now.Add(-ago))}))
		return better
	}
	set("n", 30*time.Minute)
	if !set("n", time.Minute) {
		t.Error("a stale node confirmed again is not an improvement")
	}
	if set("n", 0) {
		t.Error("a fresh node's next heartbeat counts as an improvement (every heartbeat would requeue pods)")
	}
}
