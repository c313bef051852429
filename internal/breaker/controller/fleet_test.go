package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/fleet/watch"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// waveNodes are 20 nodes of 8 GPUs, driver A on the even ones, two GPUs of 8 of those with an
// XID 79 in the last quarter hour.
func waveNodes(t *testing.T) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for n := range 20 {
		driver := "575.57.08"
		if n%2 == 0 {
			driver = "580.95.05"
		}
		summaries := map[string]gpuhealthv1.GPUSummary{}
		for g := range 8 {
			s := gpuhealthv1.GPUSummary{Index: g, Model: "H100", Health: health.Healthy.String()}
			if n%2 == 0 && n < 16 && g < 2 {
				s.History = gpuhealthv1.SummarizeHistory([]health.HistoryEntry{{Time: time.Now().Add(-15 * time.Minute), Kind: health.HistoryFault, Reason: "XID79"}})
			}
			summaries[fmt.Sprintf("GPU-%02d-%d", n, g)] = s
		}
		b, err := json.Marshal(summaries)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%02d", n), Labels: map[string]string{fleet.DriverVersionLabel: driver},
			Annotations: map[string]string{gpuhealthv1.HealthKey: string(b)}}})
	}
	return out
}

// TestRunJudgesTheFleet: with SharedCauses the leader publishes the fleet's verdict, and the
// metrics say so.
func TestRunJudgesTheFleet(t *testing.T) {
	client := fake.NewClientset(waveNodes(t)...)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Client: client, Namespace: "ns", Window: 10 * time.Minute, MetricsAddress: "127.0.0.1:0",
			Ready: func(a string) { addr <- a }, SharedCauses: &watch.Settings{}})
	}()
	metrics := "http://" + <-addr + "/metrics"
	var body string
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		resp, err := http.Get(metrics)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && strings.Contains(body, `gpuhealth_fleet_findings{attribute="driver",value="580.95.05"} 1`), nil
	})
	if err != nil {
		t.Fatalf("no finding in the metrics: %v\n%s", err, body)
	}
	for _, want := range []string{"gpuhealth_fleet_workload_signatures 0", "gpuhealth_fleet_judged_timestamp_seconds 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	cm, err := client.CoreV1().ConfigMaps("ns").Get(ctx, watch.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if f, err := watch.ParseFindings(cm); err != nil || len(f.SharedCauses) != 1 {
		t.Errorf("the ConfigMap's verdict %+v (%v), want driver A's finding", f, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
