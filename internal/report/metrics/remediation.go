package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Remediation holds the remediation metrics of one agent:
//
//	gpuhealth_remediation_events_total{node,event}        repair steps: Started, ResetStarted (an attempt),
//	                                                      Repaired, AttemptFailed, GaveUp, ...
//	gpuhealth_remediation_repair_seconds{node}            from the start of a repair to the GPU's return to service
//	gpuhealth_remediation_gpus{node,phase}                GPUs in each phase now
//	gpuhealth_validation_runs_total{node,result}          active tests of a repaired GPU: passed, failed, error
//	gpuhealth_validation_seconds{node}                    how long each test ran
type Remediation struct {
	node           string
	events         *prometheus.CounterVec
	repair         *prometheus.HistogramVec
	gpus           *prometheus.GaugeVec
	validationRuns *prometheus.CounterVec
	validationTime *prometheus.HistogramVec
}

// NewRemediation returns the remediation metrics of the agent on node.
func NewRemediation(node string) *Remediation {
	return &Remediation{
		node: node,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_remediation_events_total",
			Help: "Remediation steps by kind: ResetStarted counts attempts, Repaired successes, AttemptFailed failed attempts, GaveUp GPUs left for a node reboot.",
		}, []string{"node", "event"}),
		repair: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuhealth_remediation_repair_seconds",
			Help:    "Time from the start of a GPU's repair (fault seen) to its return to service after probation.",
			Buckets: prometheus.ExponentialBuckets(5, 2, 12),
		}, []string{"node"}),
		gpus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuhealth_remediation_gpus", Help: "GPUs of this node in each remediation phase.",
		}, []string{"node", "phase"}),
		validationRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_validation_runs_total",
			Help: "Active tests of a repaired GPU by verdict: passed, failed (a failed repair attempt), error (no verdict: the GPU stays out and the test is run again).",
		}, []string{"node", "result"}),
		validationTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpuhealth_validation_seconds",
			Help: "How long one active test of a repaired GPU ran (DCGM's level-2 diagnostic takes about 2 minutes).",
			// 1 s to about 68 min: level 1 takes seconds, level 3 about 15 minutes.
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}, []string{"node"}),
	}
}

// Validation results, as the runs counter labels them (validation.Result).
var validationResults = map[string]string{"ValidationPassed": "passed", "ValidationFailed": "failed", "ValidationError": "error"}

// Register registers the collectors with reg.
func (r *Remediation) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{r.events, r.repair, r.gpus, r.validationRuns, r.validationTime} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Event counts one repair step; d is the repair time of a Repaired step and the run time of a
// validation's verdict (ValidationPassed, ValidationFailed, ValidationError).
func (r *Remediation) Event(kind string, d time.Duration) {
	r.events.WithLabelValues(r.node, kind).Inc()
	if kind == "Repaired" {
		r.repair.WithLabelValues(r.node).Observe(d.Seconds())
	}
	if result, ok := validationResults[kind]; ok {
		r.validationRuns.WithLabelValues(r.node, result).Inc()
		r.validationTime.WithLabelValues(r.node).Observe(d.Seconds())
	}
}

// Phases sets how many GPUs are in each of phases (every phase named, zeros included, so a
// phase left empty drops to 0).
func (r *Remediation) Phases(counts map[string]int) {
	for phase, n := range counts {
		r.gpus.WithLabelValues(r.node, phase).Set(float64(n))
	}
}
