package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuhealth/gpuhealth/internal/report/metrics"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestMetricsFollowTheTrackerAtScrapeTime(t *testing.T) {
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a", Index: 0, Model: "H100"}})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New("n1", tr.Snapshot)
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	at := time.Unix(0, 0)
	var transitions []health.Transition
	for range 500 {
		transitions, _ = tr.Observe(health.XIDSignal("GPU-a", 79, at), transitions)
	}
	m.Transitions(transitions)
	m.ObserveSync("annotation", 1, nil)
	m.Unmatched("devicetaint")

	want := `
# HELP gpuhealth_gpu_health GPU health: 0 Healthy, 1 Degraded, 2 Unhealthy.
# TYPE gpuhealth_gpu_health gauge
gpuhealth_gpu_health{index="0",model="H100",node="n1",uuid="GPU-a"} 2
# HELP gpuhealth_xid_total XIDs seen on a GPU since the agent started, including ones that do not change health.
# TYPE gpuhealth_xid_total counter
gpuhealth_xid_total{index="0",node="n1",uuid="GPU-a",xid="79"} 500
# HELP gpuhealth_transitions_total GPU health transitions, by the health reached.
# TYPE gpuhealth_transitions_total counter
gpuhealth_transitions_total{node="n1",to="Unhealthy"} 1
# HELP gpuhealth_api_writes_total Writes to the API server, by reporter.
# TYPE gpuhealth_api_writes_total counter
gpuhealth_api_writes_total{reporter="annotation"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"gpuhealth_gpu_health", "gpuhealth_xid_total", "gpuhealth_transitions_total", "gpuhealth_api_writes_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "gpuhealth_unmatched_devices_total"); n != 1 {
		t.Errorf("unmatched series = %d, want 1", n)
	}
}

func TestUnmonitoredChecksAreExported(t *testing.T) {
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.SetUnmonitored("GPU-a", true); err != nil {
		t.Fatal(err)
	}
	if err := tr.SetCheckUnmonitored("GPU-a", health.CheckECC, true); err != nil {
		t.Fatal(err)
	}
	m := metrics.New("n1", tr.Snapshot)
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP gpuhealth_gpu_unmonitored 1 for each check the agent cannot run on a GPU (a driver function missing, ECC off, MIG mode; "events" when NVML delivers no events).
# TYPE gpuhealth_gpu_unmonitored gauge
gpuhealth_gpu_unmonitored{check="ecc",index="0",node="n1",uuid="GPU-a"} 1
gpuhealth_gpu_unmonitored{check="events",index="0",node="n1",uuid="GPU-a"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpuhealth_gpu_unmonitored"); err != nil {
		t.Error(err)
	}
}
