package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel"
)

// NVSentinel holds the nvsentinel reporter's metrics:
//
//	gpuhealth_nvsentinel_sends_total{node,result}   sends to the platform-connector: ok, error,
//	                                                unavailable (no socket: nothing dialled)
//	gpuhealth_nvsentinel_pending_events{node}       events NVSentinel still lacks (0: up to date)
type NVSentinel struct {
	node    string
	sends   *prometheus.CounterVec
	pending *prometheus.GaugeVec
}

var _ nvsentinel.Observer = (*NVSentinel)(nil)

// NewNVSentinel returns the nvsentinel reporter's metrics of the agent on node, every result at
// zero.
func NewNVSentinel(node string) *NVSentinel {
	n := &NVSentinel{
		node: node,
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhealth_nvsentinel_sends_total",
			Help: "Sends of health events to NVSentinel's platform-connector, by result: ok, error (retried with backoff), unavailable (no socket; retried).",
		}, []string{"node", "result"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuhealth_nvsentinel_pending_events",
			Help: "Health events NVSentinel still lacks (0: it holds gpuhealth's current state).",
		}, []string{"node"}),
	}
	for _, r := range nvsentinel.Results() {
		n.sends.WithLabelValues(node, r)
	}
	n.pending.WithLabelValues(node)
	return n
}

// Register registers the collectors with reg.
func (n *NVSentinel) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{n.sends, n.pending} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// ObserveSend implements nvsentinel.Observer.
func (n *NVSentinel) ObserveSend(result string, _ int) { n.sends.WithLabelValues(n.node, result).Inc() }

// ObservePending implements nvsentinel.Observer.
func (n *NVSentinel) ObservePending(events int) {
	n.pending.WithLabelValues(n.node).Set(float64(events))
}
