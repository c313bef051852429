// Package metrics exposes GPU health and the agent's own work as Prometheus metrics. Per-GPU
// values are computed from the latest snapshot at scrape time, so a GPU that disappears stops
// being reported and no label set leaks.
//
//	gpuhealth_gpu_health{node,uuid,index,model}               0 Healthy, 1 Degraded, 2 Unhealthy
//	gpuhealth_gpu_evict{node,uuid,index,model}                1 when a condition asks for eviction
//	gpuhealth_gpu_condition{node,uuid,index,type,reason,severity} 1 for each condition in effect
//	gpuhealth_gpu_unmonitored{node,uuid,index,check}      1 for each check the agent cannot run ("events" when NVML delivers none)
//	gpuhealth_xid_total{node,uuid,index,xid}                  XIDs seen, including application XIDs
//	gpuhealth_transitions_total{node,to}                      health transitions
//	gpuhealth_api_writes_total{reporter}                      writes to the API server
//	gpuhealth_api_sync_errors_total{reporter}                 failed syncs
//	gpuhealth_api_sync_duration_seconds{reporter}             how long one reporter sync takes
//	gpuhealth_unmatched_devices_total{reporter}               unhealthy GPUs with no object to mark
//	gpuhealth_signal_latency_seconds                          from a signal's observation to its evaluation
//	gpuhealth_circuit_breaker_held_gpus{node}                 GPUs the circuit breaker holds back
//
// Counters with labels the agent knows in advance (each reporter, each health reached) start at
// zero, so that rate() and increase() see their first increment: a series that appears at 1 has
// no increase to show, and an alert on the first API error would miss it.
//
// Sources (sources.go) adds the kernel log's: gpuhealth_source_up, gpuhealth_xid_source_total,
// gpuhealth_xid_duplicates_total, gpuhealth_kmsg_records_total, gpuhealth_kmsg_skipped_total.
package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/report"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Metrics owns the agent's collectors. Register them with Register.
type Metrics struct {
	node     string
	snapshot func() health.Snapshot

	healthDesc, evictDesc, conditionDesc, xidDesc, unmonitoredDesc, findingDesc *prometheus.Desc

	transitions   *prometheus.CounterVec
	writes        *prometheus.CounterVec
	syncErrors    *prometheus.CounterVec
	syncDuration  *prometheus.HistogramVec
	unmatched     *prometheus.CounterVec
	signalLatency prometheus.Histogram
	breakerHeld   *prometheus.GaugeVec
}

var (
	_ prometheus.Collector = (*Metrics)(nil)
	_ report.Observer      = (*Metrics)(nil)
)

// New returns the metrics of the agent on node; snapshot is called at every scrape (pass the
// tracker's Snapshot method).
func New(node string, snapshot func() health.Snapshot) *Metrics {
	gpuLabels := []string{"node", "uuid", "index", "model"}
	m := &Metrics{
		node:       node,
		snapshot:   snapshot,
		healthDesc: prometheus.NewDesc("gpuhealth_gpu_health", "GPU health: 0 Healthy, 1 Degraded, 2 Unhealthy.", gpuLabels, nil),
		evictDesc:  prometheus.NewDesc("gpuhealth_gpu_evict", "1 when a condition in effect asks for eviction of running work.", gpuLabels, nil),
		findingDesc: prometheus.NewDesc("gpuhealth_node_finding", "For each node finding in effect (an XID spread over GPUs: likely software; GPUs missing), the number of GPUs it names.",
			[]string{"node", "reason"}, nil),
		conditionDesc: prometheus.NewDesc("gpuhealth_gpu_condition", "1 for each condition in effect on a GPU.", []string{"node", "uuid", "index", "type", "reason", "severity"}, nil),
		xidDesc:       prometheus.NewDesc("gpuhealth_xid_total", "XIDs seen on a GPU since the agent started, including ones that do not change health.", []string{"node", "uuid", "index", "xid"}, nil),
		unmonitoredDesc: prometheus.NewDesc("gpuhealth_gpu_unmonitored", "1 for each check the agent cannot run on a GPU (a driver function missing, ECC off, MIG mode; \"events\" when NVML delivers no events).",
			[]string{"node", "uuid", "index", "check"}, nil),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_transitions_total", Help: "GPU health transitions, by the health reached.",
		}, []string{"node", "to"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_api_writes_total", Help: "Writes to the API server, by reporter.",
		}, []string{"reporter"}),
		syncErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_api_sync_errors_total", Help: "Failed reporter syncs (each is retried with backoff).",
		}, []string{"reporter"}),
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpuhealth_api_sync_duration_seconds", Help: "Time one reporter sync takes, its API calls included, successful or not.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8), // 1 ms .. 16 s
		}, []string{"reporter"}),
		unmatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_unmatched_devices_total", Help: "Times a GPU that is not healthy had no object to mark (for example no DRA device with its UUID).",
		}, []string{"reporter"}),
		breakerHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuhealth_circuit_breaker_held_gpus", Help: "GPUs of this node the circuit breaker holds back from NoSchedule/NoExecute (0: closed).",
		}, []string{"node"}),
		signalLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpuhealth_signal_latency_seconds",
			Help:    "Time from a signal's observation by the backend to its evaluation.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
	}
	for _, h := range []health.Severity{health.Healthy, health.Degraded, health.Unhealthy} {
		m.transitions.WithLabelValues(node, h.String())
	}
	return m
}

// Reporter exports the counters of the reporter name at zero before its first sync; marks says
// whether it marks devices, and so may count GPUs it found nothing to mark for (Unmatched).
func (m *Metrics) Reporter(name string, marks bool) {
	m.writes.WithLabelValues(name)
	m.syncErrors.WithLabelValues(name)
	if marks {
		m.unmatched.WithLabelValues(name)
	}
}

// Register registers every collector with reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m, m.transitions, m.writes, m.syncErrors, m.syncDuration, m.unmatched, m.signalLatency, m.breakerHeld} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Transitions counts health transitions.
func (m *Metrics) Transitions(transitions []health.Transition) {
	for _, t := range transitions {
		m.transitions.WithLabelValues(m.node, t.To.String()).Inc()
	}
}

// ObserveSync implements report.Observer.
func (m *Metrics) ObserveSync(reporter string, writes int, took time.Duration, err error) {
	m.syncDuration.WithLabelValues(reporter).Observe(took.Seconds())
	if writes > 0 {
		m.writes.WithLabelValues(reporter).Add(float64(writes))
	}
	if err != nil {
		m.syncErrors.WithLabelValues(reporter).Inc()
	}
}

// Unmatched counts a GPU that a reporter could not mark.
func (m *Metrics) Unmatched(reporter string) { m.unmatched.WithLabelValues(reporter).Inc() }

// BreakerHeld records how many GPUs of this node the circuit breaker holds back.
func (m *Metrics) BreakerHeld(n int) { m.breakerHeld.WithLabelValues(m.node).Set(float64(n)) }

// ObserveSignal records how long a signal waited before evaluation.
func (m *Metrics) ObserveSignal(observed, evaluated time.Time) {
	if d := evaluated.Sub(observed); d >= 0 {
		m.signalLatency.Observe(d.Seconds())
	}
}

// SignalObserver returns what a backend's feed calls with every signal the monitor applied
// (health.Feed's observe): how long the signal waited, by clk.
func (m *Metrics) SignalObserver(clk clock.PassiveClock) func(health.Signal) {
	return func(sig health.Signal) { m.ObserveSignal(sig.Time, clk.Now()) }
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.healthDesc
	ch <- m.evictDesc
	ch <- m.conditionDesc
	ch <- m.xidDesc
	ch <- m.unmonitoredDesc
	ch <- m.findingDesc
}

// Collect implements prometheus.Collector from the latest snapshot.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	snap := m.snapshot()
	for _, f := range snap.Findings {
		if metric, err := prometheus.NewConstMetric(m.findingDesc, prometheus.GaugeValue, float64(len(f.GPUs)), m.node, f.Reason); err == nil {
			ch <- metric
		}
	}
	for _, d := range snap.Devices {
		idx := strconv.Itoa(d.Device.Index)
		send := func(desc *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
			if metric, err := prometheus.NewConstMetric(desc, t, v, labels...); err == nil {
				ch <- metric
			}
		}
		send(m.healthDesc, prometheus.GaugeValue, float64(d.Health), m.node, d.Device.UUID, idx, d.Device.Model)
		evict := 0.0
		if d.Evict {
			evict = 1
		}
		send(m.evictDesc, prometheus.GaugeValue, evict, m.node, d.Device.UUID, idx, d.Device.Model)
		for _, c := range d.Conditions {
			send(m.conditionDesc, prometheus.GaugeValue, 1, m.node, d.Device.UUID, idx, string(c.Type), c.Reason, c.Severity.String())
		}
		for _, x := range d.XIDs {
			send(m.xidDesc, prometheus.CounterValue, float64(x.Count), m.node, d.Device.UUID, idx, strconv.FormatUint(uint64(x.XID), 10))
		}
		for _, check := range gpuhealthv1.Unmonitored(d) {
			send(m.unmonitoredDesc, prometheus.GaugeValue, 1, m.node, d.Device.UUID, idx, check)
		}
	}
}
