package extender

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"
)

// Verbs of the extender API, the verb label of its metrics.
const (
	verbFilter     = "filter"
	verbPrioritize = "prioritize"
	verbBind       = "bind"
)

// metrics are what the extender serves on /metrics:
//
//	gpuhealth_extender_request_duration_seconds{verb}  time to answer filter, prioritize, bind
//	gpuhealth_extender_request_errors_total{verb}      calls answered with an error
//	gpuhealth_extender_filter_nodes_total{result}      nodes /filter passed or failed
//	gpuhealth_extender_refused_total{reason}           calls refused unread: unauthenticated, busy
//	gpuhealth_extender_stale_nodes                     nodes whose report is stale (Options.StaleAfter)
//	gpuhealth_extender_oldest_heartbeat_age_seconds    age of the oldest heartbeat among the nodes
//
// Every label value is known in advance and starts at zero, so that rate() sees the first call.
type metrics struct {
	registry *prometheus.Registry
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	filtered *prometheus.CounterVec
	refused  *prometheus.CounterVec
	// filteredPassed and filteredFailed are filtered's two series, looked up once.
	filteredPassed, filteredFailed prometheus.Counter
}

// newMetrics returns the metrics in a registry of their own, with the Go and process collectors
// (as the agent's and the breaker controller's). Registering distinct collectors on a new
// registry cannot fail.
func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpuhealth_extender_request_duration_seconds", Help: "Time the extender takes to answer a scheduler call, by verb.",
			// kube-scheduler's httpTimeout defaults to 5 s (the chart's extender.scheduler.httpTimeout).
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10), // 0.1 ms .. 26 s
		}, []string{"verb"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_extender_request_errors_total", Help: "Scheduler calls answered with an error (a bad request, or a bind that failed), by verb.",
		}, []string{"verb"}),
		filtered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_extender_filter_nodes_total", Help: "Nodes /filter passed or failed, by result.",
		}, []string{"result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_extender_refused_total", Help: "Scheduler calls refused before reading them: without a verified client certificate (unauthenticated), or over the concurrency limit (busy).",
		}, []string{"reason"}),
	}
	m.registry.MustRegister(m.duration, m.errors, m.filtered, m.refused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, verb := range []string{verbFilter, verbPrioritize, verbBind} {
		m.duration.WithLabelValues(verb)
		m.errors.WithLabelValues(verb)
	}
	m.refused.WithLabelValues("unauthenticated")
	m.refused.WithLabelValues("busy")
	m.filteredPassed = m.filtered.WithLabelValues("passed")
	m.filteredFailed = m.filtered.WithLabelValues("failed")
	return m
}

// watchStaleness adds the staleness gauges, computed from st at each scrape.
func (m *metrics) watchStaleness(st *state, clk clock.PassiveClock, staleAfter time.Duration) {
	scan := func() (stale int, oldest time.Duration) {
		now := clk.Now()
		st.read(func(v view) {
			for _, sl := range v.s.nodes {
				if sl.entry == nil {
					continue
				}
				n := &sl.entry.gpus
				if s, _ := n.Stale(now, staleAfter); s {
					stale++
				}
				if !n.Heartbeat.IsZero() {
					oldest = max(oldest, now.Sub(n.Heartbeat))
				}
			}
		})
		return stale, oldest
	}
	m.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuhealth_extender_stale_nodes",
			Help: "Nodes whose gpuhealth report is stale (heartbeat older than --stale-after, or unreadable): GPU pods are not placed on them."},
			func() float64 { n, _ := scan(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuhealth_extender_oldest_heartbeat_age_seconds",
			Help: "Age of the oldest agent heartbeat among the nodes the extender knows (0: none has one)."},
			func() float64 { _, d := scan(); return d.Seconds() }))
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
