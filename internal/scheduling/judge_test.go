package scheduling

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func parsed(node *corev1.Node) *NodeGPUs {
	n, _ := ParseNode(node)
	return &n
}

func unhealthyIDs(ids string) map[string]string {
	return map[string]string{gpuhealthv1.UnhealthyIDsKey: ids}
}

var judgedAt = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// heartbeat is the annotations of a node whose agent last confirmed its report age before
// judgedAt, with the Unhealthy indexes ids.
func heartbeat(age time.Duration, ids string) map[string]string {
	ann := map[string]string{gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(judgedAt.Add(-age))}
	if ids != "" {
		ann[gpuhealthv1.UnhealthyIDsKey] = ids
	}
	return ann
}

func TestJudgeNode(t *testing.T) {
	whole := func(n int64) Request { return Request{GPUs: n} }
	const staleAfter = 15 * time.Minute
	tests := []struct {
		name    string
		req     Request
		node    *corev1.Node
		used    Usage
		explain bool
		want    Verdict
		// reason is part of the reason wanted (the whole reason is Filter's, tested there).
		reason string
	}{
		{name: "fits", req: whole(4), node: gpuNode("n", 8, heartbeat(time.Minute, "0")), want: Verdict{Fits: true}},
		{name: "stale", req: whole(1), node: gpuNode("n", 8, heartbeat(time.Hour, "")), explain: true,
			want: Verdict{HealthBlocks: true}, reason: "stale since 2026-12-03T11:00:00Z"},
		{name: "stale, not explained", req: whole(1), node: gpuNode("n", 8, heartbeat(time.Hour, "")),
			want: Verdict{}, reason: "stale since"},
		{name: "an unreadable heartbeat is stale", req: whole(1), node: gpuNode("n", 8, map[string]string{gpuhealthv1.HeartbeatKey: "soon"}), explain: true,
			want: Verdict{HealthBlocks: true}, reason: "unreadable"},
		{name: "a heartbeat far in the future is stale", req: whole(1), node: gpuNode("n", 8, heartbeat(-time.Hour, "")), explain: true,
			want: Verdict{HealthBlocks: true}, reason: "is in the future"},
		{name: "a clock a little ahead is forgiven", req: whole(1), node: gpuNode("n", 8, heartbeat(-time.Minute, "")), want: Verdict{Fits: true}},
		{name: "a pod without GPUs fits a stale node", req: Request{}, node: gpuNode("n", 8, heartbeat(time.Hour, "")), want: Verdict{Fits: true}},
		{name: "unhealthy GPUs are in the way", req: whole(4), node: gpuNode("n", 8, heartbeat(time.Minute, "0,1,2,3,4,5")), explain: true,
			want: Verdict{HealthBlocks: true}, reason: "4 requested"},
		{name: "unhealthy GPUs in the way, not explained", req: whole(4), node: gpuNode("n", 8, unhealthyIDs("0,1,2,3,4,5")),
			want: Verdict{}, reason: "4 requested"},
		{name: "pods alone are in the way", req: whole(4), node: gpuNode("n", 8, unhealthyIDs("0")), used: Usage{GPUs: 6}, explain: true,
			want: Verdict{}, reason: "4 requested"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := Judge{Now: judgedAt, StaleAfter: staleAfter, Explain: tc.explain}
			got := j.Node(tc.req, parsed(tc.node), tc.used)
			if got.Fits != tc.want.Fits || got.HealthBlocks != tc.want.HealthBlocks {
				t.Errorf("verdict %+v, want fits=%v healthBlocks=%v", got, tc.want.Fits, tc.want.HealthBlocks)
			}
			if got.Fits != (got.Reason == "") {
				t.Errorf("verdict %+v: a reason is given exactly when the pod does not fit", got)
			}
			if !strings.Contains(got.Reason, tc.reason) {
				t.Errorf("reason %q, want it to say %q", got.Reason, tc.reason)
			}
		})
	}
	t.Run("the zero Judge judges no report stale", func(t *testing.T) {
		var j Judge
		if got := j.Node(Request{GPUs: 1}, parsed(gpuNode("n", 8, heartbeat(time.Hour, ""))), Usage{}); !got.Fits {
			t.Errorf("verdict %+v, want fits", got)
		}
	})
}

func TestJudgeHealthBlocks(t *testing.T) {
	whole := func(n int64) Request { return Request{GPUs: n} }
	tests := []struct {
		name string
		req  Request
		node *corev1.Node
		used Usage
		want bool
	}{
		{"unhealthy GPUs are in the way", whole(4), gpuNode("n", 8, unhealthyIDs("0,1,2,3,4,5")), Usage{}, true},
		{"unhealthy GPUs and pods are in the way", whole(4), gpuNode("n", 8, unhealthyIDs("0,1,2,3")), Usage{GPUs: 3}, true},
		{"pods alone are in the way", whole(4), gpuNode("n", 8, unhealthyIDs("0")), Usage{GPUs: 6}, false},
		{"the node is too small", whole(16), gpuNode("n", 8, unhealthyIDs("0")), Usage{}, false},
		{"no GPUs", whole(1), gpuNode("n", 0, nil), Usage{}, false},
		{"an unhealthy shared card", Request{MemoryMiB: 8000}, sharingNode("n", 2, 16000, unhealthyIDs("0")), Usage{CardMemory: map[int]int64{1: 10000}}, true},
		{"the request is larger than a card", Request{MemoryMiB: 20000}, sharingNode("n", 2, 16000, unhealthyIDs("0")), Usage{}, false},
	}
	// One Judge for all, as one request's nodes share one: the scratch space is reused.
	j := Judge{Explain: true}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := parsed(tc.node)
			before := healths(*n)
			got := j.Node(tc.req, n, tc.used)
			if got.Fits {
				t.Fatal("the request fits; the cases are of requests that do not")
			}
			if got.HealthBlocks != tc.want {
				t.Errorf("HealthBlocks = %v, want %v", got.HealthBlocks, tc.want)
			}
			if after := healths(*n); after != before {
				t.Errorf("judging changed the node's GPUs: %s, then %s", before, after)
			}
		})
	}
}

func TestImproved(t *testing.T) {
	const staleAfter = 15 * time.Minute
	tests := []struct {
		name       string
		prev, next *NodeGPUs
		staleAfter time.Duration
		want       bool
	}{
		{"new to the cache", nil, parsed(gpuNode("n", 8, nil)), 0, true},
		{"unchanged", parsed(gpuNode("n", 8, unhealthyIDs("0,1"))), parsed(gpuNode("n", 8, unhealthyIDs("0,1"))), 0, false},
		{"a GPU recovers", parsed(gpuNode("n", 8, unhealthyIDs("0,1"))), parsed(gpuNode("n", 8, unhealthyIDs("1"))), 0, true},
		{"one recovers, another fails", parsed(gpuNode("n", 8, unhealthyIDs("0"))), parsed(gpuNode("n", 8, unhealthyIDs("1"))), 0, true},
		{"a GPU fails", parsed(gpuNode("n", 8, unhealthyIDs("0"))), parsed(gpuNode("n", 8, unhealthyIDs("0,1"))), 0, false},
		{"undrained", parsed(gpuNode("n", 8, map[string]string{gpuhealthv1.DrainsKey: `{"GPU-a":{"index":2}}`})), parsed(gpuNode("n", 8, nil)), 0, true},
		{"a GPU turns Degraded", parsed(gpuNode("n", 8, nil)), parsed(gpuNode("n", 8, map[string]string{gpuhealthv1.HealthKey: `{"GPU-0":{"index":0,"health":"Degraded"}}`})), 0, false},
		{"Unhealthy to Degraded", parsed(gpuNode("n", 8, unhealthyIDs("0"))), parsed(gpuNode("n", 8, map[string]string{gpuhealthv1.HealthKey: `{"GPU-0":{"index":0,"health":"Degraded"}}`})), 0, true},
		{"more GPUs", parsed(gpuNode("n", 4, nil)), parsed(gpuNode("n", 8, nil)), 0, true},
		{"fewer GPUs", parsed(gpuNode("n", 8, nil)), parsed(gpuNode("n", 4, nil)), 0, false},
		{"the recovered GPU is gone", parsed(gpuNode("n", 8, unhealthyIDs("7"))), parsed(gpuNode("n", 4, nil)), 0, false},
		{"a stale report confirmed again", parsed(gpuNode("n", 8, heartbeat(time.Hour, ""))), parsed(gpuNode("n", 8, heartbeat(0, ""))), staleAfter, true},
		{"a stale report confirmed again, staleness off", parsed(gpuNode("n", 8, heartbeat(time.Hour, ""))), parsed(gpuNode("n", 8, heartbeat(0, ""))), 0, false},
		{"a fresh report confirmed again", parsed(gpuNode("n", 8, heartbeat(time.Minute, ""))), parsed(gpuNode("n", 8, heartbeat(0, ""))), staleAfter, false},
		{"a report goes stale", parsed(gpuNode("n", 8, heartbeat(time.Minute, ""))), parsed(gpuNode("n", 8, heartbeat(time.Hour, ""))), staleAfter, false},
		{"an unreadable heartbeat made readable", parsed(gpuNode("n", 8, map[string]string{gpuhealthv1.HeartbeatKey: "soon"})), parsed(gpuNode("n", 8, heartbeat(0, ""))), staleAfter, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Improved(tc.prev, tc.next, judgedAt, tc.staleAfter); got != tc.want {
				t.Errorf("Improved = %v, want %v", got, tc.want)
			}
		})
	}
}
