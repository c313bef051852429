package scheduling

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func qty(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }

func container(requests, limits corev1.ResourceList) corev1.Container {
	return corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Requests: requests, Limits: limits}}
}

func TestPodRequest(t *testing.T) {
	gpu := func(n int64) corev1.ResourceList { return corev1.ResourceList{ResourceGPU: qty(n)} }
	mem := func(n int64) corev1.ResourceList { return corev1.ResourceList{ResourceGPUMemory: qty(n)} }
	tests := []struct {
		name string
		spec corev1.PodSpec
		want Request
	}{
		{name: "no GPU", spec: corev1.PodSpec{Containers: []corev1.Container{container(corev1.ResourceList{corev1.ResourceCPU: qty(1)}, nil)}}},
		{name: "limits only", spec: corev1.PodSpec{Containers: []corev1.Container{container(nil, gpu(2))}}, want: Request{GPUs: 2}},
		{name: "summed over containers", spec: corev1.PodSpec{Containers: []corev1.Container{container(gpu(1), gpu(1)), container(nil, gpu(3))}}, want: Request{GPUs: 4}},
		{
			name: "an init container asking more wins",
			spec: corev1.PodSpec{InitContainers: []corev1.Container{container(gpu(5), nil)}, Containers: []corev1.Container{container(gpu(1), nil)}},
			want: Request{GPUs: 5},
		},
		{
			name: "a sidecar adds to the containers",
			spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: "s", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Resources: corev1.ResourceRequirements{Limits: gpu(1)}}},
				Containers:     []corev1.Container{container(gpu(2), nil)},
			},
			want: Request{GPUs: 3},
		},
		{name: "GPU memory", spec: corev1.PodSpec{Containers: []corev1.Container{container(nil, mem(4096)), container(mem(1024), nil)}}, want: Request{MemoryMiB: 5120}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := PodRequest(&corev1.Pod{Spec: tc.spec}); got != tc.want {
				t.Errorf("PodRequest = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPodHold(t *testing.T) {
	pod := func(node string, phase corev1.PodPhase, ann map[string]string, res corev1.ResourceList) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: ann},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{container(res, nil)}},
			Status:     corev1.PodStatus{Phase: phase},
		}
	}
	gpu2 := corev1.ResourceList{ResourceGPU: qty(2)}
	mem := corev1.ResourceList{ResourceGPUMemory: qty(1000)}
	tests := []struct {
		name    string
		pod     *corev1.Pod
		want    Hold
		wantOK  bool
		warning string
	}{
		{name: "pending", pod: pod("", corev1.PodPending, nil, gpu2)},
		{name: "finished", pod: pod("n", corev1.PodSucceeded, nil, gpu2)},
		{name: "failed", pod: pod("n", corev1.PodFailed, nil, gpu2)},
		{name: "no GPU", pod: pod("n", corev1.PodRunning, nil, corev1.ResourceList{corev1.ResourceCPU: qty(1)})},
		{name: "whole GPUs", pod: pod("n", corev1.PodRunning, nil, gpu2), want: Hold{Node: "n", GPUs: 2, Card: NoCard}, wantOK: true},
		{name: "shared card", pod: pod("n", corev1.PodPending, map[string]string{GPUIndexAnnotation: "3"}, mem), want: Hold{Node: "n", Card: 3, MemoryMiB: 1000}, wantOK: true},
		{
			name: "shared without index", pod: pod("n", corev1.PodRunning, nil, mem),
			want: Hold{Node: "n", Card: NoCard}, wantOK: true, warning: "has no volcano.sh/gpu-index",
		},
		{
			name: "shared with a bad index", pod: pod("n", corev1.PodRunning, map[string]string{GPUIndexAnnotation: "-1"}, mem),
			want: Hold{Node: "n", Card: NoCard}, wantOK: true, warning: "not a card index",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, warning := PodHold(tc.pod)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("PodHold = %+v, %v; want %+v, %v", got, ok, tc.want, tc.wantOK)
			}
			if (tc.warning == "") != (warning == "") || !strings.Contains(warning, tc.warning) {
				t.Errorf("warning = %q, want one containing %q", warning, tc.warning)
			}
		})
	}
}

func TestUsageAddRemove(t *testing.T) {
	var u Usage
	a := Hold{GPUs: 2, Card: NoCard}
	b := Hold{Card: 1, MemoryMiB: 500}
	u.Add(a)
	u.Add(b)
	u.Add(b)
	if u.GPUs != 2 || u.CardMemory[1] != 1000 {
		t.Fatalf("after adds: %+v", u)
	}
	u.Remove(b)
	u.Remove(b)
	u.Remove(a)
	if u.GPUs != 0 || len(u.CardMemory) != 0 {
		t.Fatalf("after removes: %+v", u)
	}
}

func TestPlaceWholeGPUs(t *testing.T) {
	tests := []struct {
		name      string
		node      *corev1.Node
		want      int64
		used      int64
		fits      bool
		reason    string // substring
		wantScore int64
	}{
		{name: "empty node", node: gpuNode("n", 8, nil), want: 2, fits: true, wantScore: 4},
		{name: "packs onto a busy node", node: gpuNode("n", 8, nil), want: 2, used: 6, fits: true, wantScore: 10},
		{name: "no GPUs", node: gpuNode("n", 0, nil), want: 1, reason: "node has no nvidia.com/gpu"},
		{
			name: "unhealthy GPUs do not count", node: gpuNode("n", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5"}),
			want: 3, reason: "not enough healthy GPUs: 3 requested, 2 free (6 unhealthy or drained, 0 in use)",
		},
		{
			name: "exactly the healthy GPUs", node: gpuNode("n", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5"}),
			want: 2, fits: true, wantScore: 10,
		},
		{
			name: "GPUs in use do not count", node: gpuNode("n", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0"}),
			want: 2, used: 6, reason: "1 free (1 unhealthy or drained, 6 in use)",
		},
		{
			name: "drained GPUs do not count",
			node: gpuNode("n", 4, map[string]string{gpuhealthv1.DrainsKey: drainsJSON(t, map[string]int{"GPU-a": 0, "GPU-b": 1, "GPU-c": 2})}),
			want: 2, reason: "2 requested, 1 free (3 unhealthy or drained",
		},
		{
			name: "a HAMi node: GPUs cordoned in hami.io/device-cordon do not count",
			node: gpuNode("n", 4, map[string]string{
				gpuhealthv1.HealthKey:     healthJSON(t, map[int]string{0: "Healthy", 1: "Healthy", 2: "Healthy", 3: "Healthy"}),
				gpuhealthv1.HAMiCordonKey: uuid(1) + "," + uuid(3),
			}),
			want: 3, reason: "3 requested, 2 free (2 unhealthy or drained, 0 in use)",
		},
		{
			name: "Degraded GPUs fit but halve the score",
			node: gpuNode("n", 8, map[string]string{gpuhealthv1.HealthKey: healthJSON(t, map[int]string{7: "Degraded"})}),
			want: 4, fits: true, wantScore: 3,
		},
		{
			name: "a pod that must use a Degraded GPU scores 0",
			node: gpuNode("n", 4, map[string]string{gpuhealthv1.HealthKey: healthJSON(t, map[int]string{2: "Degraded", 3: "Degraded"})}),
			want: 3, fits: true, wantScore: 0,
		},
	}
	reasons := &Reasons{} // shared by the cases, as by the nodes of one request
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, _ := ParseNode(tc.node)
			p := Place(Request{GPUs: tc.want}, &n, Usage{GPUs: tc.used})
			if p.Fits != tc.fits {
				t.Fatalf("fits = %v (%q), want %v", p.Fits, p.Reason, tc.fits)
			}
			if !tc.fits && !strings.Contains(p.Reason, tc.reason) {
				t.Errorf("reason = %q, want it to contain %q", p.Reason, tc.reason)
			}
			if tc.fits && p.Score != tc.wantScore {
				t.Errorf("score = %d, want %d", p.Score, tc.wantScore)
			}
			if !tc.fits && p.Score != 0 {
				t.Errorf("score = %d for a node that does not fit", p.Score)
			}
			fits, reason := Filter(Request{GPUs: tc.want}, &n, Usage{GPUs: tc.used})
			if fits != p.Fits || reason != p.Reason || Score(Request{GPUs: tc.want}, &n, Usage{GPUs: tc.used}) != p.Score {
				t.Errorf("Filter/Score disagree with Place")
			}
			for range 2 { // built, then remembered
				if fits, reason := FilterWith(reasons, Request{GPUs: tc.want}, &n, Usage{GPUs: tc.used}); fits != p.Fits || reason != p.Reason {
					t.Errorf("FilterWith = %v, %q; Place says %v, %q", fits, reason, p.Fits, p.Reason)
				}
				if score := ScoreWith(reasons, Request{GPUs: tc.want}, &n, Usage{GPUs: tc.used}); score != p.Score {
					t.Errorf("ScoreWith = %d, Place says %d", score, p.Score)
				}
			}
		})
	}
}

func TestPlaceShared(t *testing.T) {
	const card = 16000
	tests := []struct {
		name      string
		node      *corev1.Node
		want      int64
		used      map[int]int64
		wantCard  int
		reason    string
		wantScore int64
	}{
		{name: "empty node: card 0", node: sharingNode("n", 4, card, nil), want: 4000, wantCard: 0, wantScore: 4},
		{name: "packs onto the fullest card that fits", node: sharingNode("n", 4, card, nil), want: 4000, used: map[int]int64{1: 8000, 2: 14000, 3: 12000}, wantCard: 3, wantScore: 10},
		{name: "not a sharing node", node: gpuNode("n", 8, nil), want: 1000, wantCard: NoCard, reason: "does not share GPUs"},
		{name: "more than a card", node: sharingNode("n", 2, card, nil), want: card + 1, wantCard: NoCard, reason: "more than a card's 16000 MiB"},
		{
			name: "skips unhealthy and drained cards",
			node: sharingNode("n", 3, card, map[string]string{gpuhealthv1.UnhealthyIDsKey: "1", gpuhealthv1.DrainsKey: drainsJSON(t, map[string]int{"GPU-x": 2})}),
			want: 1000, used: map[int]int64{1: 15000, 2: 15000}, wantCard: 0, wantScore: 2,
		},
		{
			name: "no healthy card has room",
			node: sharingNode("n", 2, card, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0"}),
			want: 8000, used: map[int]int64{1: 9000}, wantCard: NoCard, reason: "no healthy GPU has 8000 MiB free (1 of 2 cards unhealthy or drained)",
		},
		{
			name: "a healthy card before a fuller Degraded one, with a penalty",
			node: sharingNode("n", 2, card, map[string]string{gpuhealthv1.HealthKey: healthJSON(t, map[int]string{0: "Degraded", 1: "Healthy"})}),
			want: 4000, used: map[int]int64{0: 8000}, wantCard: 1, wantScore: 3,
		},
		{
			name: "only a Degraded card: fits with score 0",
			node: sharingNode("n", 2, card, map[string]string{gpuhealthv1.HealthKey: healthJSON(t, map[int]string{0: "Degraded", 1: "Unhealthy"})}),
			want: 4000, wantCard: 0, wantScore: 0,
		},
	}
	reasons := &Reasons{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, _ := ParseNode(tc.node)
			req := Request{MemoryMiB: tc.want}
			used := Usage{CardMemory: tc.used}
			p := Place(req, &n, used)
			if p.Card != tc.wantCard || ChooseCard(req, &n, used) != tc.wantCard {
				t.Errorf("card = %d (%q), want %d", p.Card, p.Reason, tc.wantCard)
			}
			if p.Fits != (tc.reason == "") || !strings.Contains(p.Reason, tc.reason) {
				t.Errorf("fits = %v, reason = %q; want reason containing %q", p.Fits, p.Reason, tc.reason)
			}
			if p.Score != tc.wantScore {
				t.Errorf("score = %d, want %d", p.Score, tc.wantScore)
			}
			for range 2 { // built, then remembered
				if fits, reason := FilterWith(reasons, req, &n, used); fits != p.Fits || reason != p.Reason {
					t.Errorf("FilterWith = %v, %q; Place says %v, %q", fits, reason, p.Fits, p.Reason)
				}
			}
		})
	}
}

// TestReasonsStayBounded fills a Reasons with more distinct reasons than it keeps: it starts
// over instead of growing, and every answer is still the one Filter gives.
func TestReasonsStayBounded(t *testing.T) {
	n, _ := ParseNode(gpuNode("n", 8, nil))
	var reasons Reasons
	for want := int64(9); want < 9+2*maxReasons+5; want++ {
		fits, reason := FilterWith(&reasons, Request{GPUs: want}, &n, Usage{})
		wantFits, wantReason := Filter(Request{GPUs: want}, &n, Usage{})
		if fits != wantFits || reason != wantReason {
			t.Fatalf("%d GPUs: FilterWith = %v, %q; Filter = %v, %q", want, fits, reason, wantFits, wantReason)
		}
		if len(reasons.m) > maxReasons {
			t.Fatalf("%d reasons kept, want at most %d", len(reasons.m), maxReasons)
		}
	}
}

func TestPlaceBothAndNeither(t *testing.T) {
	node := gpuNode("n", 2, nil)
	node.Status.Capacity[ResourceGPUNumber] = qty(2)
	node.Status.Capacity[ResourceGPUMemory] = qty(2000)
	n, _ := ParseNode(node)
	if p := Place(Request{}, &n, Usage{}); !p.Fits || p.Score != 0 || p.Card != NoCard {
		t.Errorf("no request: %+v, want fits with score 0", p)
	}
	if p := Place(Request{GPUs: 1, MemoryMiB: 500}, &n, Usage{}); !p.Fits || p.Card != 0 {
		t.Errorf("both: %+v, want fits on card 0", p)
	}
	if p := Place(Request{GPUs: 3, MemoryMiB: 500}, &n, Usage{}); p.Fits {
		t.Errorf("too many whole GPUs: %+v, want no fit", p)
	}
}
