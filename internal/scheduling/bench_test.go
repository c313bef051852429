package scheduling

import (
	"testing"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// BenchmarkParseNode parses one 8-GPU node carrying all three annotations, the cost the extender
// pays per node change (informer path) or per node in a request whose resourceVersion is not
// cached (nodeCacheCapable: false).
func BenchmarkParseNode(b *testing.B) {
	node := gpuNode("n", 8, map[string]string{
		gpuhealthv1.UnhealthyIDsKey: "3",
		gpuhealthv1.HealthKey:       healthJSON(b, map[int]string{0: "Healthy", 1: "Healthy", 2: "Degraded", 3: "Unhealthy", 4: "Healthy", 5: "Healthy", 6: "Healthy", 7: "Healthy"}),
		gpuhealthv1.DrainsKey:       drainsJSON(b, map[string]int{uuid(5): 5}),
	})
	b.ReportAllocs()
	for b.Loop() {
		if n, w := ParseNode(node); n.Unhealthy != 2 || len(w) != 0 {
			b.Fatalf("unhealthy %d, warnings %q", n.Unhealthy, w)
		}
	}
}

// BenchmarkPlace is the pure placement of a 4-GPU pod on one parsed node.
func BenchmarkPlace(b *testing.B) {
	n, _ := ParseNode(gpuNode("n", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "3"}))
	b.ReportAllocs()
	for b.Loop() {
		Place(Request{GPUs: 4}, &n, Usage{GPUs: 2})
	}
}
