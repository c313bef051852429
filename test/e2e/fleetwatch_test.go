//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/gpuhealth/gpuhealth/internal/cli"
	"github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/fleet/watch"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestFleetWatch runs `gpuhealth breaker controller` with a HealthConfig that turns on
// fleet.sharedCauses (every 10s, the least allowed) against the real API server, as its
// least-privilege ServiceAccount plus watch.ClusterRoleRules: 20 nodes of 8 GPUs on two drivers.
// Two GPUs of each of 8 of driver A's 10 nodes fail with XID 79, and a job of 6 GPUs (3 named on
// its pods, 3 held through ResourceClaims) on driver B's nodes logs XID 45 on every one within
// 3 s: the ConfigMap gpuhealth-fleet-findings names driver A alone and the job's signature, one
// FleetSharedCause Event and one FleetWorkloadSignature Event are posted on it, and
// gpuhealth_fleet_findings has driver A's series. The agents' reports then lose the faults (the GPUs were replaced): one
// FleetSharedCauseGone Event, no series, and still only the one FleetSharedCause Event.
func TestFleetWatch(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	if _, err := c.CreateNamespace(ctx, agentNamespace); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	reports := createFleetWatchNodes(t, c)
	cfg := filepath.Join(t.TempDir(), "healthconfig.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nfleet:\n  sharedCauses: {enabled: true, every: 10s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	grantFleetPods(t, c)
	metrics := startBreakerControllerWith(t, c, []string{"--config", cfg, "--agent-silence=false"})
	findingSeries := `gpuhealth_fleet_findings{attribute="driver",value="` + fleetDriverA + `"} 1`

	eventually(t, "the ConfigMap names driver A and the job's signature, the metrics driver A", func(ctx context.Context) (bool, string, error) {
		f, err := fleetVerdict(ctx, c)
		if err != nil {
			return false, err.Error(), nil
		}
		body, err := httpGet(metrics + "/metrics")
		if err != nil {
			return false, err.Error(), nil
		}
		ok := len(f.SharedCauses) == 1 && f.SharedCauses[0].Attribute == fleet.AttributeDriver && f.SharedCauses[0].Value == fleetDriverA &&
			f.SharedCauses[0].FaultyGPUs == 16 && len(f.Signatures) == 1 && f.Signatures[0].Workload == "podgroup/default/job-1" &&
			f.Signatures[0].SpannedGPUs == 6 && !f.WorkloadsUnknown &&
			strings.Contains(body, findingSeries) && strings.Contains(body, "gpuhealth_fleet_workload_signatures 1")
		return ok, fmt.Sprintf("verdict %+v; metrics have the series: %v", f, strings.Contains(body, findingSeries)), nil
	})
	eventually(t, "one FleetSharedCause and one FleetWorkloadSignature Event on the ConfigMap", func(ctx context.Context) (bool, string, error) {
		shared, err := fleetEvents(ctx, c, watch.EventSharedCause)
		if err != nil {
			return false, err.Error(), nil
		}
		sigs, err := fleetEvents(ctx, c, watch.EventWorkloadSignature)
		if err != nil {
			return false, err.Error(), nil
		}
		return len(shared) == 1 && strings.HasPrefix(shared[0], corev1.EventTypeWarning) && strings.Contains(shared[0], "driver="+fleetDriverA) && strings.Contains(shared[0], "16 of its 80 GPUs") &&
			len(sigs) == 1 && strings.Contains(sigs[0], "podgroup/default/job-1: XID45 on 6 of its 6 GPUs"), fmt.Sprintf("%q %q", shared, sigs), nil
	})

	// gpuhealth status says so on each of the job's GPUs, and on no other.
	out, stderr, code := gpuhealthCLI(t, "status", "-o", "json", "--kubeconfig", c.AdminKubeconfig(), "--agent-namespace", agentNamespace, "--stale-after=0")
	var status struct{ GPUs []cli.GPUStatus }
	if err := json.Unmarshal([]byte(out), &status); code != 0 || err != nil {
		t.Fatalf("status: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	marked := 0
	for _, g := range status.GPUs {
		if g.WorkloadSignature != "" {
			marked++
			if g.WorkloadSignature != "podgroup/default/job-1" || !slices.Contains(g.Reasons, cli.SignatureReasonPrefix+"podgroup/default/job-1") {
				t.Errorf("status of %s/%d: signature %q, reasons %v", g.Node, g.Index, g.WorkloadSignature, g.Reasons)
			}
		}
	}
	if marked != 6 {
		t.Errorf("status marks %d GPUs as the job's signature, want its 6", marked)
	}

	// The GPUs were replaced: their reports hold no fault.
	for n := range 20 {
		writeReport(t, c, fleetNode(n), reports(n, false))
	}
	eventually(t, "the finding is gone: a FleetSharedCauseGone Event, no series", func(ctx context.Context) (bool, string, error) {
		f, err := fleetVerdict(ctx, c)
		if err != nil {
			return false, err.Error(), nil
		}
		gone, err := fleetEvents(ctx, c, watch.EventSharedCauseGone)
		if err != nil {
			return false, err.Error(), nil
		}
		body, err := httpGet(metrics + "/metrics")
		if err != nil {
			return false, err.Error(), nil
		}
		saidGone := len(gone) == 1 && strings.HasPrefix(gone[0], corev1.EventTypeNormal) && strings.Contains(gone[0], "driver="+fleetDriverA)
		noSeries := !strings.Contains(body, "gpuhealth_fleet_findings{") && strings.Contains(body, "gpuhealth_fleet_workload_signatures 0")
		return len(f.SharedCauses) == 0 && len(f.Signatures) == 0 && saidGone && noSeries, fmt.Sprintf("verdict %+v, gone %q", f, gone), nil
	})
	shared, err := fleetEvents(ctx, c, watch.EventSharedCause)
	if err != nil || len(shared) != 1 {
		t.Errorf("FleetSharedCause Events %q (%v), want the one, posted once over every period the finding stayed", shared, err)
	}
}

// The drivers of TestFleetWatch's nodes: A on the even ones, B on the odd ones.
const fleetDriverA, fleetDriverB = "580.95.05", "575.57.08"

// createFleetWatchNodes creates TestFleetWatch's 20 nodes with their reports and job-1's pods,
// and returns the report of node n, with or without its faults.
func createFleetWatchNodes(t *testing.T, c *controlplane.Cluster) (reports func(n int, withFaults bool) map[string]gpuhealthv1.GPUSummary) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Second)
	faulty := func(n, g int) bool { return n%2 == 0 && n < 16 && g < 2 }
	job := func(n, g int) bool { return n%2 == 1 && n < 12 && g == 7 }
	reports = func(n int, withFaults bool) map[string]gpuhealthv1.GPUSummary {
		out := map[string]gpuhealthv1.GPUSummary{}
		for g := range 8 {
			s := gpuhealthv1.GPUSummary{Index: g, Model: "NVIDIA H100 80GB HBM3", Health: health.Healthy.String()}
			switch {
			case withFaults && faulty(n, g):
				at := now.Add(-time.Duration(10+n+g) * time.Minute)
				s.History = gpuhealthv1.SummarizeHistory([]health.HistoryEntry{{Time: at, Kind: health.HistoryFault, Reason: "XID79"}, {Time: at.Add(time.Minute), Kind: health.HistoryReset}})
			case withFaults && job(n, g):
				at := now.Add(-5*time.Minute + time.Duration(n%3)*time.Second)
				s.History = gpuhealthv1.SummarizeHistory([]health.HistoryEntry{{Time: at, Kind: health.HistoryFault, Reason: "XID45"}})
			}
			out[fleetGPU(n, g)] = s
		}
		return out
	}
	for n := range 20 {
		driver := fleetDriverB
		if n%2 == 0 {
			driver = fleetDriverA
		}
		if _, err := c.CreateReadyNode(t.Context(), fleetNode(n), map[string]string{fleet.DriverVersionLabel: driver}); err != nil {
			t.Fatal(err)
		}
		writeReport(t, c, fleetNode(n), reports(n, true))
		// The job's pods on nodes 1, 5 and 9 name their card; those on 3, 7 and 11 hold it
		// through a ResourceClaim of a device of the node's ResourceSlice.
		for g := range 8 {
			switch {
			case job(n, g) && n%4 == 1:
				createJobPod(t, c, fleetNode(n), g, fleetGPU(n, g))
			case job(n, g):
				createClaimJobPod(t, c, fleetNode(n), g)
			}
		}
		if n%4 == 3 && n < 12 {
			uuids := make([]string, 8)
			for g := range uuids {
				uuids[g] = fleetGPU(n, g)
			}
			if _, err := c.Admin().ResourceV1().ResourceSlices().Create(t.Context(), controlplane.GPUResourceSlice(fleetNode(n), uuids...), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return reports
}

// grantFleetPods lets the breaker controller's ServiceAccount list and watch pods and
// ResourceClaims too, as the
// chart does with config.fleet.sharedCauses.enabled (watch.ClusterRoleRules).
func grantFleetPods(t *testing.T, c *controlplane.Cluster) {
	t.Helper()
	grantClusterRules(t, c, "gpuhealth-breaker-controller-fleet", "gpuhealth-breaker-controller", watch.ClusterRoleRules())
}

func fleetNode(n int) string   { return fmt.Sprintf("fleetwatch-%02d", n) }
func fleetGPU(n, g int) string { return fmt.Sprintf("GPU-%08d-1111-0000-0000-%012d", n, g) }

// writeReport writes summaries as the node's gpu-health annotation, as its agent would.
func writeReport(t *testing.T, c *controlplane.Cluster, node string, summaries map[string]gpuhealthv1.GPUSummary) {
	t.Helper()
	b, err := json.Marshal(summaries)
	if err != nil {
		t.Fatal(err)
	}
	nodes := c.Admin().CoreV1().Nodes()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[gpuhealthv1.HealthKey] = string(b)
		_, err = nodes.Update(t.Context(), n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// fleetVerdict reads the controller's verdict from its ConfigMap.
func fleetVerdict(ctx context.Context, c *controlplane.Cluster) (watch.Findings, error) {
	cm, err := c.Admin().CoreV1().ConfigMaps(agentNamespace).Get(ctx, watch.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return watch.Findings{}, err
	}
	return watch.ParseFindings(cm)
}

// fleetEvents returns the Events of reason on the controller's ConfigMap, each as its type and
// message, and its count if more than one.
func fleetEvents(ctx context.Context, c *controlplane.Cluster, reason string) ([]string, error) {
	evs, err := c.Admin().CoreV1().Events(agentNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind != "ConfigMap" || e.InvolvedObject.Name != watch.ConfigMapName {
			return nil, fmt.Errorf("a %s Event on %s %s", reason, e.InvolvedObject.Kind, e.InvolvedObject.Name)
		}
		msg := e.Type + " " + e.Message
		if e.Count > 1 {
			msg += fmt.Sprintf(" (x%d)", e.Count)
		}
		out = append(out, msg)
	}
	return out, nil
}
