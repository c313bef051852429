package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRemediationMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRemediation("n1")
	if err := r.Register(reg); err != nil {
		t.Fatal(err)
	}
	r.Event("ResetStarted", 0)
	r.Event("ResetStarted", 0)
	r.Event("Repaired", 42*time.Second)
	r.Phases(map[string]int{"Probation": 1, "Resetting": 0})
	want := `
# HELP gpuhealth_remediation_events_total Remediation steps by kind: ResetStarted counts attempts, Repaired successes, AttemptFailed failed attempts, GaveUp GPUs left for a node reboot.
# TYPE gpuhealth_remediation_events_total counter
gpuhealth_remediation_events_total{event="Repaired",node="n1"} 1
gpuhealth_remediation_events_total{event="ResetStarted",node="n1"} 2
# HELP gpuhealth_remediation_gpus GPUs of this node in each remediation phase.
# TYPE gpuhealth_remediation_gpus gauge
gpuhealth_remediation_gpus{node="n1",phase="Probation"} 1
gpuhealth_remediation_gpus{node="n1",phase="Resetting"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpuhealth_remediation_events_total", "gpuhealth_remediation_gpus"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(r.repair); n != 1 {
		t.Errorf("%d repair-time series, want 1", n)
	}
	if err := r.Register(reg); err == nil {
		t.Error("registering twice succeeded")
	}
}
