package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuhealth/gpuhealth/internal/report/metrics"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

type fakeKernelLog struct {
	up    bool
	stats kmsg.Stats
	xids  map[string]health.DedupStats
}

func (f fakeKernelLog) Up() bool                                 { return f.up }
func (f fakeKernelLog) Stats() kmsg.Stats                        { return f.stats }
func (f fakeKernelLog) XIDSources() map[string]health.DedupStats { return f.xids }

type fakeBackend struct{ up bool }

func (f fakeBackend) SourceName() string { return "nvml" }
func (f fakeBackend) Up() bool           { return f.up }

func TestSourcesMetrics(t *testing.T) {
	tests := []struct {
		name    string
		log     fakeKernelLog
		backend metrics.Backend
		want    string
	}{
		{
			name: "kernel log read, an XID seen by both and one by NVML alone",
			log: fakeKernelLog{
				up:    true,
				stats: kmsg.Stats{Records: 900, Spoofed: 2, Overruns: 1},
				xids:  map[string]health.DedupStats{"nvml": {Reported: 2}, "kmsg": {Reported: 1, Duplicates: 1}},
			},
			want: `
# HELP gpuhealth_source_up 1 while a signal source is read (source=nvml: the GPU backend; source=kmsg: the kernel log), 0 when it is off or cannot be read.
# TYPE gpuhealth_source_up gauge
gpuhealth_source_up{node="n1",source="kmsg"} 1
# HELP gpuhealth_xid_source_total XIDs each source reported (nvml: the GPU backend's events, kmsg: the kernel log), duplicates included.
# TYPE gpuhealth_xid_source_total counter
gpuhealth_xid_source_total{node="n1",source="kmsg"} 1
gpuhealth_xid_source_total{node="n1",source="nvml"} 2
# HELP gpuhealth_xid_duplicates_total XIDs a source reported that the other source had already reported within the match window; they were counted once.
# TYPE gpuhealth_xid_duplicates_total counter
gpuhealth_xid_duplicates_total{node="n1",source="kmsg"} 1
gpuhealth_xid_duplicates_total{node="n1",source="nvml"} 0
# HELP gpuhealth_kmsg_records_total Kernel log records read.
# TYPE gpuhealth_kmsg_records_total counter
gpuhealth_kmsg_records_total{node="n1"} 900
# HELP gpuhealth_kmsg_skipped_total Kernel log records or events skipped, by reason (an overrun may lose several records).
# TYPE gpuhealth_kmsg_skipped_total counter
gpuhealth_kmsg_skipped_total{node="n1",reason="alreadyApplied"} 0
gpuhealth_kmsg_skipped_total{node="n1",reason="badXID"} 0
gpuhealth_kmsg_skipped_total{node="n1",reason="malformed"} 0
gpuhealth_kmsg_skipped_total{node="n1",reason="overrun"} 1
gpuhealth_kmsg_skipped_total{node="n1",reason="spoofed"} 2
gpuhealth_kmsg_skipped_total{node="n1",reason="unknownDevice"} 0
`,
		},
		{
			name: "kernel log unreadable",
			log:  fakeKernelLog{},
			want: `
# HELP gpuhealth_source_up 1 while a signal source is read (source=nvml: the GPU backend; source=kmsg: the kernel log), 0 when it is off or cannot be read.
# TYPE gpuhealth_source_up gauge
gpuhealth_source_up{node="n1",source="kmsg"} 0
`,
		},
		{
			name:    "NVML down after a reset",
			log:     fakeKernelLog{up: true},
			backend: fakeBackend{up: false},
			want: `
# HELP gpuhealth_source_up 1 while a signal source is read (source=nvml: the GPU backend; source=kmsg: the kernel log), 0 when it is off or cannot be read.
# TYPE gpuhealth_source_up gauge
gpuhealth_source_up{node="n1",source="kmsg"} 1
gpuhealth_source_up{node="n1",source="nvml"} 0
`,
		},
		{
			name:    "NVML up",
			log:     fakeKernelLog{},
			backend: fakeBackend{up: true},
			want: `
# HELP gpuhealth_source_up 1 while a signal source is read (source=nvml: the GPU backend; source=kmsg: the kernel log), 0 when it is off or cannot be read.
# TYPE gpuhealth_source_up gauge
gpuhealth_source_up{node="n1",source="kmsg"} 0
gpuhealth_source_up{node="n1",source="nvml"} 1
`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if err := reg.Register(metrics.NewSources("n1", tc.log, tc.backend)); err != nil {
				t.Fatal(err)
			}
			names := []string{"gpuhealth_source_up", "gpuhealth_xid_source_total", "gpuhealth_xid_duplicates_total", "gpuhealth_kmsg_records_total", "gpuhealth_kmsg_skipped_total"}
			if tc.log.xids == nil {
				names = names[:1]
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want), names...); err != nil {
				t.Error(err)
			}
		})
	}
}
