package metrics_test

import (
	"errors"
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
	m.ObserveSync("annotation", 1, time.Millisecond, nil)
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
gpuhealth_transitions_total{node="n1",to="Degraded"} 0
gpuhealth_transitions_total{node="n1",to="Healthy"} 0
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

func TestNodeFindingsAreExported(t *testing.T) {
	devs := []health.Device{{UUID: "GPU-a", Index: 0, PCIBusID: "0000:10:00.0"}}
	devs = append(devs, health.MissingGPUs(devs, []string{"0000:10:00.0", "0000:11:00.0"}, 0)...)
	tr, err := health.NewTracker(health.DefaultPolicy(), devs)
	if err != nil {
		t.Fatal(err)
	}
	tr.Tick(time.Unix(1, 0), nil) // the placeholder's GPUMissing is raised once the time is known
	reg := prometheus.NewRegistry()
	if err := metrics.New("n1", tr.Snapshot).Register(reg); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP gpuhealth_node_finding For each node finding in effect (an XID spread over GPUs: likely software; GPUs missing), the number of GPUs it names.
# TYPE gpuhealth_node_finding gauge
gpuhealth_node_finding{node="n1",reason="GPUsMissing"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpuhealth_node_finding"); err != nil {
		t.Error(err)
	}
}

// A counter that appears at 1 shows no increase, so an alert on increase() or rate() would miss
// the first API error: the known series start at zero.
func TestKnownSeriesStartAtZero(t *testing.T) {
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a", Index: 0}})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New("n1", tr.Snapshot)
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	m.Reporter("annotation", false)
	m.Reporter("devicetaint", true)
	want := `
# HELP gpuhealth_api_sync_errors_total Failed reporter syncs (each is retried with backoff).
# TYPE gpuhealth_api_sync_errors_total counter
gpuhealth_api_sync_errors_total{reporter="annotation"} 0
gpuhealth_api_sync_errors_total{reporter="devicetaint"} 0
# HELP gpuhealth_api_writes_total Writes to the API server, by reporter.
# TYPE gpuhealth_api_writes_total counter
gpuhealth_api_writes_total{reporter="annotation"} 0
gpuhealth_api_writes_total{reporter="devicetaint"} 0
# HELP gpuhealth_transitions_total GPU health transitions, by the health reached.
# TYPE gpuhealth_transitions_total counter
gpuhealth_transitions_total{node="n1",to="Degraded"} 0
gpuhealth_transitions_total{node="n1",to="Healthy"} 0
gpuhealth_transitions_total{node="n1",to="Unhealthy"} 0
# HELP gpuhealth_unmatched_devices_total Times a GPU that is not healthy had no object to mark (for example no DRA device with its UUID).
# TYPE gpuhealth_unmatched_devices_total counter
gpuhealth_unmatched_devices_total{reporter="devicetaint"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpuhealth_api_sync_errors_total",
		"gpuhealth_api_writes_total", "gpuhealth_transitions_total", "gpuhealth_unmatched_devices_total"); err != nil {
		t.Error(err)
	}

	m.ObserveSync("annotation", 0, 3*time.Millisecond, errors.New("conflict"))
	want = `
# HELP gpuhealth_api_sync_errors_total Failed reporter syncs (each is retried with backoff).
# TYPE gpuhealth_api_sync_errors_total counter
gpuhealth_api_sync_errors_total{reporter="annotation"} 1
gpuhealth_api_sync_errors_total{reporter="devicetaint"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpuhealth_api_sync_errors_total"); err != nil {
		t.Error(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "gpuhealth_api_sync_duration_seconds" {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		if len(f.GetMetric()) != 1 || h.GetSampleCount() != 1 || h.GetSampleSum() != 0.003 {
			t.Errorf("sync duration = %v, want one sample of 3ms for annotation", f.GetMetric())
		}
		return
	}
	t.Error("no gpuhealth_api_sync_duration_seconds after a sync")
}
