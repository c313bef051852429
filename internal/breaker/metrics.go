package breaker

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// ControllerMetrics are what the breaker controller (`gpuhealth breaker controller`) serves on
// /metrics, in a registry of their own with the Go and process collectors:
//
//	gpuhealth_breaker_cluster_gpus   the cluster's GPUs as last written to the ConfigMap
//	gpuhealth_breaker_leader         1 while this replica leads and counts
//	gpuhealth_breaker_slots_swept_total{pool}  slots deleted because they stopped counting
//	gpuhealth_breaker_stale_nodes    nodes left out of the count: their agents' heartbeats are stale
//
// The agents export the breaker's effect themselves (gpuhealth_circuit_breaker_held_gpus).
type ControllerMetrics struct {
	Registry                        *prometheus.Registry
	ClusterGPUs, Leader, StaleNodes prometheus.Gauge
	SlotsSwept                      *prometheus.CounterVec
}

// NewControllerMetrics returns the controller's metrics, registered. Registering distinct
// collectors on a new registry cannot fail.
func NewControllerMetrics() *ControllerMetrics {
	m := &ControllerMetrics{
		Registry: prometheus.NewRegistry(),
		ClusterGPUs: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuhealth_breaker_cluster_gpus",
			Help: "The cluster's GPUs as last written to the circuit breaker's ConfigMap (0: not counted yet)."}),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuhealth_breaker_leader",
			Help: "1 while this replica leads and counts, else 0."}),
		StaleNodes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuhealth_breaker_stale_nodes",
			Help: "Nodes left out of the cluster's GPU count because their agents' heartbeats are stale (or unreadable)."}),
		SlotsSwept: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuhealth_breaker_slots_swept_total",
			Help: "Slots (Leases) deleted because they stopped counting, by pool (the slot name's prefix)."}, []string{"pool"}),
	}
	m.Registry.MustRegister(m.ClusterGPUs, m.Leader, m.StaleNodes, m.SlotsSwept, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
