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
//	gpuhealth_breaker_domain_full{label,value}  1 while a domain's budget is used up (series only for those)
//	gpuhealth_breaker_stale_nodes    nodes left out of the count: their agents' heartbeats are stale
//	gpuhealth_agent_silent_nodes     nodes marked because their agents went silent (package silence)
//	gpuhealth_agent_silences_total   agents that went silent, as the controller saw them go
//	gpuhealth_fleet_findings{attribute,value}  1 per current shared cause (internal/fleet/watch; series only for those)
//	gpuhealth_fleet_workload_signatures  the workload signatures of the current verdict
//	gpuhealth_fleet_judged_timestamp_seconds  when this replica last judged the fleet (0: never)
//	gpuhealth_gpu_records_written_total{created}  GPURecords written (fleet.records; internal/fleet/records)
//
// The agents export the breaker's effect themselves (gpuhealth_circuit_breaker_held_gpus).
type ControllerMetrics struct {
	Registry                        *prometheus.Registry
	ClusterGPUs, Leader, StaleNodes prometheus.Gauge
	SlotsSwept                      *prometheus.CounterVec
	DomainFull                      *prometheus.GaugeVec
	SilentNodes                     prometheus.Gauge
	Silences                        prometheus.Counter
	FleetFindings                   *prometheus.GaugeVec
	FleetSignatures, FleetJudged    prometheus.Gauge
	RecordsWritten                  *prometheus.CounterVec
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
		DomainFull: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuhealth_breaker_domain_full",
			Help: "1 while the circuit breaker's budget of one domain (a value of a domain label) is used up: its further GPUs are held. Only full domains have a series."}, []string{"label", "value"}),
		SilentNodes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuhealth_agent_silent_nodes",
			Help: "Nodes whose gpuhealth agent is silent (heartbeat stale, unreadable, in the future or removed), marked AgentSilent."}),
		Silences: prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuhealth_agent_silences_total",
			Help: "Agents that went silent, counted when the controller marks their node."}),
		FleetFindings: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuhealth_fleet_findings",
			Help: "1 per current shared cause of GPU faults (fleet.sharedCauses): the GPUs whose attribute has this value fail far more often than the rest. Only current findings have a series."}, []string{"attribute", "value"}),
		FleetSignatures: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuhealth_fleet_workload_signatures",
			Help: "Workload signatures in the current verdict on the fleet (a workload's faults of one reason on many of its GPUs at once)."}),
		FleetJudged: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuhealth_fleet_judged_timestamp_seconds",
			Help: "When this replica last judged the fleet, its verdict in the ConfigMap gpuhealth-fleet-findings, in seconds since the epoch (0: never, or fleet.sharedCauses is off)."}),
		RecordsWritten: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuhealth_gpu_records_written_total",
			Help: "GPURecords written from the agents' reports (fleet.records): created true for a GPU's first record, false for a change of one."}, []string{"created"}),
	}
	m.Registry.MustRegister(m.ClusterGPUs, m.Leader, m.StaleNodes, m.SlotsSwept, m.DomainFull, m.SilentNodes, m.Silences,
		m.FleetFindings, m.FleetSignatures, m.FleetJudged, m.RecordsWritten, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// SetDomainFull sets or removes a domain's gpuhealth_breaker_domain_full series.
func (m *ControllerMetrics) SetDomainFull(label, value string, full bool) {
	if full {
		m.DomainFull.WithLabelValues(label, value).Set(1)
		return
	}
	m.DomainFull.DeleteLabelValues(label, value)
}

// SetFleetFinding sets or removes a shared cause's gpuhealth_fleet_findings series.
func (m *ControllerMetrics) SetFleetFinding(attribute, value string, current bool) {
	if current {
		m.FleetFindings.WithLabelValues(attribute, value).Set(1)
		return
	}
	m.FleetFindings.DeleteLabelValues(attribute, value)
}
