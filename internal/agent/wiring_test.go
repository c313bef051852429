package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// TestWireHandsEveryWriterToTheFanOut checks what wire builds: the fan-out is the only thing
// that reports to the Writers, so a Writer it does not hold never writes, and /readyz, which
// waits for every Writer, never turns ready. Remediation's annotation Writer, added after the
// reporters', was once left out.
func TestWireHandsEveryWriterToTheFanOut(t *testing.T) {
	sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n1\ngpus: {count: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		reporters   []string
		remediation bool
		// want are the Writers' names, scheduler path first.
		wantScheduling, wantFollowers []string
	}{
		{
			name: "defaults", reporters: nil,
			wantScheduling: []string{"annotation", "devicetaint"}, wantFollowers: []string{"condition", "claimstatus"},
		},
		{
			name: "remediation on", reporters: nil, remediation: true,
			wantScheduling: []string{"annotation", "devicetaint"}, wantFollowers: []string{"condition", "claimstatus", "remediation"},
		},
		{
			name: "remediation on, one reporter", reporters: []string{config.ReporterAnnotation}, remediation: true,
			wantScheduling: []string{"annotation"}, wantFollowers: []string{"remediation"},
		},
		{
			name: "nvsentinel follows the scheduler path", reporters: []string{config.ReporterNVSentinel, config.ReporterAnnotation},
			wantScheduling: []string{"annotation"}, wantFollowers: []string{"nvsentinel"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			clk := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
			backend := sim.New(sc, sim.Options{Clock: clk})
			opts := Options{
				NodeName: "n1", Client: adapt.Clientset(client), Backend: backend, Policy: health.DefaultPolicy(),
				Agent: config.AgentConfig{Reporters: tc.reporters, CheckpointPath: "-"},
				Clock: clk, Registry: prometheus.NewRegistry(), KernelLog: kmsg.NewCompanion(),
			}
			if tc.remediation {
				opts.Remediation = RemediationOptions{Config: config.RemediationConfig{Enabled: true, PodResourcesSocket: "-"}, Resetter: backend, Poll: time.Second}
			}
			w, err := wire(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer w.close()

			names := func(ws []*report.Writer) []string {
				var out []string
				for _, wr := range ws {
					out = append(out, wr.Name())
				}
				return out
			}
			scheduling, followers := names(w.fan.scheduling), names(w.fan.followers.writers)
			if !slices.Equal(scheduling, tc.wantScheduling) || !slices.Equal(followers, tc.wantFollowers) {
				t.Errorf("the fan-out reports to %v, then %v; want %v, then %v", scheduling, followers, tc.wantScheduling, tc.wantFollowers)
			}
			// Run starts, and /readyz waits for, w.writers: each of them must be one the fan-out reports to.
			fanned := slices.Concat(w.fan.scheduling, w.fan.followers.writers)
			for _, wr := range w.writers {
				if !slices.Contains(fanned, wr) {
					t.Errorf("Writer %s runs but the fan-out never reports to it", wr.Name())
				}
			}
			if len(w.writers) != len(fanned) {
				t.Errorf("%d Writers run, the fan-out reports to %d", len(w.writers), len(fanned))
			}
			if (w.rem != nil) != tc.remediation || (w.fan.rem != nil) != tc.remediation {
				t.Errorf("remediation wired %v (fan-out %v), want %v", w.rem != nil, w.fan.rem != nil, tc.remediation)
			}
		})
	}
}
