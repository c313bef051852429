package extender

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
)

func TestMetricsCountCallsErrorsAndFilteredNodes(t *testing.T) {
	s, _ := started(t, Options{}, cluster(t)...)
	h := s.Handler()
	names := []string{"sick", "busy", "done", "healthy", "cpu", "missing"}
	post(t, h, "/filter", extenderv1.ExtenderArgs{Pod: pod("new", "", scheduling.ResourceGPU, 3, nil), NodeNames: &names})
	post(t, h, "/filter", extenderv1.ExtenderArgs{NodeNames: &names}) // no pod: an error, no node counted
	post(t, h, "/prioritize", "not an ExtenderArgs")

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", rec.Code, rec.Body)
	}
	body := rec.Body.String()
	for _, want := range []string{
		`gpuhealth_extender_filter_nodes_total{result="failed"} 4`,
		`gpuhealth_extender_filter_nodes_total{result="passed"} 2`,
		`gpuhealth_extender_request_duration_seconds_count{verb="filter"} 2`,
		`gpuhealth_extender_request_duration_seconds_count{verb="prioritize"} 1`,
		`gpuhealth_extender_request_duration_seconds_count{verb="bind"} 0`,
		`gpuhealth_extender_request_errors_total{verb="filter"} 1`,
		`gpuhealth_extender_request_errors_total{verb="prioritize"} 1`,
		`gpuhealth_extender_request_errors_total{verb="bind"} 0`,
	} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("/metrics lacks the line %q", want)
		}
	}
	if !strings.Contains(body, "\ngo_goroutines ") {
		t.Error("/metrics lacks the Go collector's go_goroutines")
	}
	if t.Failed() {
		t.Log(body)
	}
}
