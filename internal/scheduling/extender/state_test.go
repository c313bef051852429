package extender

import (
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
)

// TestStateSlots follows one node name through the orders its events can come in: what pods hold
// on a node outlives the node's deletion (and comes before its first sighting), and the name's
// slot goes once nothing is left in it.
func TestStateSlots(t *testing.T) {
	hold := scheduling.Hold{Node: "n", GPUs: 2, Card: scheduling.NoCard}
	tests := []struct {
		name  string
		steps func(s *state)
	}{
		{"node, pod, node gone, pod gone", func(s *state) {
			s.setNode(node("n", 8, nil))
			s.observe("p", hold, true)
			s.deleteNode("n")
			s.forget("p")
		}},
		{"pod before its node, pod gone, node gone", func(s *state) {
			s.observe("p", hold, true)
			s.setNode(node("n", 8, nil))
			s.forget("p")
			s.deleteNode("n")
		}},
		{"assumed pod, node gone, pod gone", func(s *state) {
			s.setNode(node("n", 8, nil))
			s.assume("p", hold)
			s.deleteNode("n")
			s.observe("p", scheduling.Hold{}, false) // an assumed hold survives this
			s.forget("p")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newState()
			tc.steps(s)
			if len(s.nodes) != 0 || len(s.holds) != 0 {
				t.Errorf("left %d slots and %d holds, want none", len(s.nodes), len(s.holds))
			}
		})
	}

	s := newState()
	s.observe("p", hold, true)
	s.read(func(v view) {
		if node, used := v.cached("n"); node != nil || used.GPUs != 2 {
			t.Errorf("before the node: cached = %v, %+v; want no node and 2 GPUs used", node, used)
		}
	})
	s.setNode(node("n", 8, nil))
	s.deleteNode("n")
	s.read(func(v view) {
		if node, used := v.cachedBytes([]byte("n")); node != nil || used.GPUs != 2 {
			t.Errorf("after the node: cached = %v, %+v; want no node and 2 GPUs used", node, used)
		}
	})
}
