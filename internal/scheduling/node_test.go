package scheduling

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// gpuNode returns a node with n whole GPUs and the given annotations.
func gpuNode(name string, n int64, ann map[string]string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			ResourceGPU: *resource.NewQuantity(n, resource.DecimalSI),
		}},
	}
}

// sharingNode returns a node with cards cards of memPerCard MiB each (Volcano GPU sharing).
func sharingNode(name string, cards, memPerCard int64, ann map[string]string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			ResourceGPUNumber: *resource.NewQuantity(cards, resource.DecimalSI),
			ResourceGPUMemory: *resource.NewQuantity(cards*memPerCard, resource.DecimalSI),
		}},
	}
}

func uuid(i int) string { return "GPU-0000000" + string(rune('0'+i)) }

// healthJSON builds a gpu-health value: index -> health for physical GPUs.
func healthJSON(t testing.TB, h map[int]string) string {
	t.Helper()
	m := map[string]gpuhealthv1.GPUSummary{}
	for i, s := range h {
		m[uuid(i)] = gpuhealthv1.GPUSummary{Index: i, Model: "H100", Health: s}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func drainsJSON(t testing.TB, d map[string]int) string {
	t.Helper()
	m := map[string]gpuhealthv1.Drain{}
	for u, i := range d {
		m[u] = gpuhealthv1.Drain{Index: i, Reason: "maintenance", By: "admin", At: time.Unix(0, 0).UTC()}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func healths(n NodeGPUs) string {
	var b strings.Builder
	for _, g := range n.GPUs {
		switch {
		case g.Drained:
			b.WriteByte('D')
		case g.Health == health.Unhealthy:
			b.WriteByte('U')
		case g.Health == health.Degraded:
			b.WriteByte('d')
		default:
			b.WriteByte('.')
		}
	}
	return b.String()
}

func TestParseNode(t *testing.T) {
	tests := []struct {
		name         string
		node         *corev1.Node
		want         string // per GPU: . healthy, d degraded, U unhealthy, D drained
		wantWarnings int
		wantWarning  string // a substring of some warning
	}{
		{name: "no annotations", node: gpuNode("n", 4, nil), want: "...."},
		{
			name: "a missing GPU (index -1, outside the device plugin's capacity) is skipped without a warning",
			node: gpuNode("n", 2, map[string]string{gpuhealthv1.HealthKey: `{"MISSING-0000:07:00.0":{"index":-1,"health":"Unhealthy","reasons":["GPUMissing"],"missing":true}}`}),
			want: "..",
		},
		{name: "no GPUs", node: gpuNode("n", 0, nil), want: ""},
		{
			name: "volcano ids",
			node: gpuNode("n", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,3"}),
			want: "U..U....",
		},
		{
			name: "volcano ids with spaces and an empty value",
			node: gpuNode("n", 4, map[string]string{gpuhealthv1.UnhealthyIDsKey: " 1 , 2"}),
			want: ".UU.",
		},
		{
			name:         "malformed volcano ids: bad entries skipped, the rest count",
			node:         gpuNode("n", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,,x,-1,99"}),
			want:         "U.......",
			wantWarnings: 4,
			wantWarning:  `index 99 is out of range`,
		},
		{
			name:         "huge and non-UTF-8 ids",
			node:         gpuNode("n", 4, map[string]string{gpuhealthv1.UnhealthyIDsKey: "99999999999999999999999,\xff\xfe,2"}),
			want:         "..U.",
			wantWarnings: 2,
			wantWarning:  `"\xff\xfe"`,
		},
		{
			name:         "thousands of bad entries give a bounded number of warnings",
			node:         gpuNode("n", 2, map[string]string{gpuhealthv1.UnhealthyIDsKey: strings.Repeat("x,", 10000) + "1"}),
			want:         ".U",
			wantWarnings: maxWarnings + 1,
			wantWarning:  "more entries ignored",
		},
		{
			name: "a HAMi node: the cordon takes GPUs out by UUID; unknown UUIDs are reported",
			node: gpuNode("n", 4, map[string]string{
				gpuhealthv1.HealthKey:     healthJSON(t, map[int]string{0: "Healthy", 1: "Healthy", 2: "Healthy", 3: "Healthy"}),
				gpuhealthv1.HAMiCordonKey: " " + uuid(2) + ", ,GPU-not-here",
			}),
			want:         "..U.",
			wantWarnings: 1,
			wantWarning:  `GPU "GPU-not-here" is not listed`,
		},
		{
			name: "gpu-health alone",
			node: gpuNode("n", 4, map[string]string{gpuhealthv1.HealthKey: healthJSON(t, map[int]string{0: "Healthy", 1: "Degraded", 2: "Unhealthy", 3: "Healthy"})}),
			want: ".dU.",
		},
		{
			name: "union of volcano ids and gpu-health",
			node: gpuNode("n", 4, map[string]string{
				gpuhealthv1.UnhealthyIDsKey: "0",
				gpuhealthv1.HealthKey:       healthJSON(t, map[int]string{0: "Healthy", 3: "Unhealthy", 1: "Degraded"}),
			}),
			want: "Ud.U",
		},
		{
			name:         "gpu-health not JSON: ignored, volcano ids still count",
			node:         gpuNode("n", 2, map[string]string{gpuhealthv1.HealthKey: "{not json", gpuhealthv1.UnhealthyIDsKey: "1"}),
			want:         ".U",
			wantWarnings: 1,
			wantWarning:  "not a JSON object",
		},
		{
			name: "gpu-health with bad entries",
			node: gpuNode("n", 3, map[string]string{gpuhealthv1.HealthKey: `{"GPU-a":{"index":0,"health":"Unhealthy"},"GPU-b":{"index":"x"},` +
				`"GPU-c":{"index":7,"health":"Unhealthy"},"GPU-d":{"index":1,"health":"Sick"},"GPU-e":{"index":2,"health":"Degraded"},"GPU-f":[]}`}),
			want:         "U.d",
			wantWarnings: 4,
			wantWarning:  `unknown health "Sick"`,
		},
		{
			name: "MIG instance not healthy makes its card Degraded",
			node: gpuNode("n", 2, map[string]string{gpuhealthv1.HealthKey: `{"GPU-p":{"index":1,"health":"Healthy"},` +
				`"MIG-1":{"index":1,"health":"Unhealthy","parentUUID":"GPU-p"},"MIG-2":{"index":0,"health":"Unhealthy","parentUUID":"GPU-missing"}}`}),
			want:         ".d",
			wantWarnings: 1,
			wantWarning:  "parent",
		},
		{
			name: "drain by UUID known to gpu-health uses the current index",
			node: gpuNode("n", 4, map[string]string{
				gpuhealthv1.HealthKey: healthJSON(t, map[int]string{0: "Healthy", 1: "Healthy", 2: "Healthy", 3: "Healthy"}),
				gpuhealthv1.DrainsKey: drainsJSON(t, map[string]int{uuid(2): 0}),
			}),
			want:         "..D.",
			wantWarnings: 1,
			wantWarning:  "now index 2",
		},
		{
			name: "drain by UUID unknown to gpu-health uses its recorded index",
			node: gpuNode("n", 4, map[string]string{gpuhealthv1.DrainsKey: drainsJSON(t, map[string]int{"GPU-x": 1, "GPU-y": 9})}),
			want: ".D..", wantWarnings: 1, wantWarning: "index 9 is out of range",
		},
		{
			name:         "drains not JSON",
			node:         gpuNode("n", 1, map[string]string{gpuhealthv1.DrainsKey: "\xff"}),
			want:         ".",
			wantWarnings: 1,
		},
		{
			name:         "absurd capacity is clamped",
			node:         gpuNode("n", 1<<50, nil),
			want:         strings.Repeat(".", MaxGPUsPerNode),
			wantWarnings: 1,
			wantWarning:  "more than",
		},
		{
			name: "sharing node",
			node: sharingNode("n", 2, 16384, map[string]string{gpuhealthv1.UnhealthyIDsKey: "1"}),
			want: ".U",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, warnings := ParseNode(tc.node)
			if h := healths(got); h != tc.want {
				t.Errorf("health = %q, want %q (warnings %q)", h, tc.want, warnings)
			}
			if len(warnings) != tc.wantWarnings {
				t.Errorf("warnings = %q, want %d", warnings, tc.wantWarnings)
			}
			if tc.wantWarning != "" && !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, tc.wantWarning) }) {
				t.Errorf("warnings = %q, want one containing %q", warnings, tc.wantWarning)
			}
			var unhealthy, degraded int
			for _, g := range got.GPUs {
				switch g.Health {
				case health.Unhealthy:
					unhealthy++
				case health.Degraded:
					degraded++
				}
			}
			if got.Unhealthy != unhealthy || got.Degraded != degraded {
				t.Errorf("counts = %d unhealthy, %d degraded; GPUs say %d, %d", got.Unhealthy, got.Degraded, unhealthy, degraded)
			}
		})
	}
}

func TestParseNodeSharingAndUUIDs(t *testing.T) {
	n, warnings := ParseNode(sharingNode("n", 4, 16000, map[string]string{
		gpuhealthv1.HealthKey: healthJSON(t, map[int]string{0: "Healthy", 1: "Healthy", 2: "Healthy", 3: "Healthy"}),
	}))
	if len(warnings) != 0 {
		t.Fatalf("warnings: %q", warnings)
	}
	if n.Cards != 4 || n.MemoryPerCard != 16000 || n.WholeGPUs != 0 {
		t.Errorf("cards %d × %d MiB, whole %d; want 4 × 16000, 0", n.Cards, n.MemoryPerCard, n.WholeGPUs)
	}
	if got := n.UUIDOf(2); got != uuid(2) {
		t.Errorf("UUIDOf(2) = %q, want %q", got, uuid(2))
	}
	if got := n.UUIDOf(9); got != "" {
		t.Errorf("UUIDOf(9) = %q, want empty", got)
	}

	// gpu-number without gpu-memory is not a sharing node.
	node := sharingNode("n", 4, 16000, nil)
	delete(node.Status.Capacity, ResourceGPUMemory)
	n, warnings = ParseNode(node)
	if n.Cards != 0 || len(warnings) != 1 {
		t.Errorf("cards = %d, warnings %q; want 0 and one warning", n.Cards, warnings)
	}
}

// FuzzParseNode feeds arbitrary annotation values and capacities to ParseNode: it must never
// panic, and every GPU it reports must be in range with a known health.
func FuzzParseNode(f *testing.F) {
	f.Add("0,,x,-1,99", `{"GPU-a":{"index":0,"health":"Unhealthy"}}`, `{"GPU-a":{"index":0}}`, int64(8), int64(0), int64(0))
	f.Add("0,3", healthJSON(f, map[int]string{0: "Unhealthy", 1: "Degraded"}), drainsJSON(f, map[string]int{"GPU-z": 2}), int64(4), int64(4), int64(65536))
	f.Add("\xff,99999999999999999999", "{", "[]", int64(-1), int64(1<<40), int64(-5))
	f.Add("", `{"MIG-1":{"index":0,"health":"Degraded","parentUUID":"GPU-a"},"GPU-a":{"index":0,"health":"Healthy"}}`, "null", int64(1), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, ids, healthValue, drains string, gpus, cards, memory int64) {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
				gpuhealthv1.UnhealthyIDsKey: ids, gpuhealthv1.HealthKey: healthValue, gpuhealthv1.DrainsKey: drains,
			}},
			Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
				ResourceGPU:       *resource.NewQuantity(gpus, resource.DecimalSI),
				ResourceGPUNumber: *resource.NewQuantity(cards, resource.DecimalSI),
				ResourceGPUMemory: *resource.NewQuantity(memory, resource.DecimalSI),
			}},
		}
		n, _ := ParseNode(node)
		if len(n.GPUs) > MaxGPUsPerNode || n.WholeGPUs > len(n.GPUs) || n.Cards > len(n.GPUs) {
			t.Fatalf("%d GPUs, %d whole, %d cards", len(n.GPUs), n.WholeGPUs, n.Cards)
		}
		for i, g := range n.GPUs {
			if g.Index != i || g.Health > health.Unhealthy {
				t.Fatalf("GPU %d = %+v", i, g)
			}
		}
		// Placement on whatever was parsed must not panic either.
		Place(Request{GPUs: 1, MemoryMiB: 1}, &n, Usage{GPUs: 1, CardMemory: map[int]int64{0: 1}})
	})
}
