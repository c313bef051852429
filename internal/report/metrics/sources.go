package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// KernelLog is what the source metrics read of the agent's kernel log (kmsg.Companion).
type KernelLog interface {
	Up() bool
	Stats() kmsg.Stats
	XIDSources() map[string]health.DedupStats
}

// Backend is what the source metrics read of a GPU backend that can be down while the agent runs
// (the NVML backend: after a GPU reset whose re-initialisation failed).
type Backend interface {
	// SourceName is the source label: "nvml".
	SourceName() string
	Up() bool
}

// The source-up gauge: Sources serves it, and so does the agent while it waits for the driver.
const (
	SourceUpName = "gpuhealth_source_up"
	SourceUpHelp = "1 while a signal source is read (source=nvml: the GPU backend; source=kmsg: the kernel log), 0 when it is off or cannot be read."
)

// Sources exposes the signal sources, read at scrape time:
//
//	gpuhealth_source_up{node,source}                  1 while the source is read (nvml: the GPU backend, kmsg: the kernel log), else 0
//	gpuhealth_xid_source_total{node,source}           XIDs each source reported (nvml, kmsg)
//	gpuhealth_xid_duplicates_total{node,source}       of those, XIDs the other source had already reported (counted once)
//	gpuhealth_kmsg_records_total{node}                kernel log records read
//	gpuhealth_kmsg_skipped_total{node,reason}         records skipped: spoofed, malformed, overrun, unknownDevice, badXID, alreadyApplied
type Sources struct {
	node      string
	kernelLog KernelLog
	backend   Backend

	upDesc, xidDesc, dupDesc, recordsDesc, skippedDesc *prometheus.Desc
}

var _ prometheus.Collector = (*Sources)(nil)

// NewSources returns the source metrics of the agent on node. backend may be nil (a backend that
// is never down, the simulator).
func NewSources(node string, kernelLog KernelLog, backend Backend) *Sources {
	return &Sources{
		node:        node,
		kernelLog:   kernelLog,
		backend:     backend,
		upDesc:      prometheus.NewDesc(SourceUpName, SourceUpHelp, []string{"node", "source"}, nil),
		xidDesc:     prometheus.NewDesc("gpuhealth_xid_source_total", "XIDs each source reported (nvml: the GPU backend's events, kmsg: the kernel log), duplicates included.", []string{"node", "source"}, nil),
		dupDesc:     prometheus.NewDesc("gpuhealth_xid_duplicates_total", "XIDs a source reported that the other source had already reported within the match window; they were counted once.", []string{"node", "source"}, nil),
		recordsDesc: prometheus.NewDesc("gpuhealth_kmsg_records_total", "Kernel log records read.", []string{"node"}, nil),
		skippedDesc: prometheus.NewDesc("gpuhealth_kmsg_skipped_total", "Kernel log records or events skipped, by reason (an overrun may lose several records).", []string{"node", "reason"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (s *Sources) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.upDesc, s.xidDesc, s.dupDesc, s.recordsDesc, s.skippedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Sources) Collect(ch chan<- prometheus.Metric) {
	send := func(desc *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		if m, err := prometheus.NewConstMetric(desc, t, v, append([]string{s.node}, labels...)...); err == nil {
			ch <- m
		}
	}
	up := 0.0
	if s.kernelLog.Up() {
		up = 1
	}
	send(s.upDesc, prometheus.GaugeValue, up, kmsg.SourceName)
	if s.backend != nil {
		up = 0
		if s.backend.Up() {
			up = 1
		}
		send(s.upDesc, prometheus.GaugeValue, up, s.backend.SourceName())
	}
	for source, st := range s.kernelLog.XIDSources() {
		send(s.xidDesc, prometheus.CounterValue, float64(st.Reported), source)
		send(s.dupDesc, prometheus.CounterValue, float64(st.Duplicates), source)
	}
	st := s.kernelLog.Stats()
	send(s.recordsDesc, prometheus.CounterValue, float64(st.Records))
	for _, r := range []struct {
		reason string
		n      uint64
	}{
		{"spoofed", st.Spoofed}, {"malformed", st.Malformed}, {"overrun", st.Overruns},
		{"unknownDevice", st.UnknownDevice}, {"badXID", st.BadXID}, {"alreadyApplied", st.AlreadyApplied},
	} {
		send(s.skippedDesc, prometheus.CounterValue, float64(r.n), r.reason)
	}
}
