package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestNVSentinelMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	n := NewNVSentinel("n1")
	if err := n.Register(reg); err != nil {
		t.Fatal(err)
	}
	n.ObserveSend("unavailable", 3)
	n.ObserveSend("ok", 3)
	n.ObservePending(2)
	want := `
# HELP gpuhealth_nvsentinel_pending_events Health events NVSentinel still lacks (0: it holds gpuhealth's current state).
# TYPE gpuhealth_nvsentinel_pending_events gauge
gpuhealth_nvsentinel_pending_events{node="n1"} 2
# HELP gpuhealth_nvsentinel_sends_total Sends of health events to NVSentinel's platform-connector, by result: ok, error (retried with backoff), unavailable (no socket; retried).
# TYPE gpuhealth_nvsentinel_sends_total counter
gpuhealth_nvsentinel_sends_total{node="n1",result="error"} 0
gpuhealth_nvsentinel_sends_total{node="n1",result="ok"} 1
gpuhealth_nvsentinel_sends_total{node="n1",result="unavailable"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
