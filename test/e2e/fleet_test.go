//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestFleetFindsWhatFaultsShare runs `gpuhealth fleet` against the real API server: 60 nodes of
// 8 GPUs in 6 racks of 10, on three driver versions (every third node on driver A). 15 of driver A's 20 nodes lost three GPUs each
// within the hour (XID 79), two GPUs of the other 40 nodes one each; a job of 16 GPUs over 8
// nodes of the other drivers logged XID 45 on every one of its GPUs within 3 s. The command names
// driver A alone (not a rack, not the job's nodes, not rack r5, drained for maintenance), with
// its figures, and the job's signature; faults older than the window count for nothing.
func TestFleetFindsWhatFaultsShare(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Second)
	const rackLabel = "example.com/rack"
	drivers := []string{"580.95.05", "575.57.08", "570.172.08"}
	type gpuFault struct {
		at     time.Time
		reason string
	}
	var jobGPUs []string
	for n := range 60 {
		name := fmt.Sprintf("fleet-%02d", n)
		labels := map[string]string{fleet.DriverVersionLabel: drivers[n%3], rackLabel: fmt.Sprintf("r%d", n/10)}
		node, err := c.CreateReadyNode(ctx, name, labels)
		if err != nil {
			t.Fatal(err)
		}
		faults := map[int]gpuFault{}
		switch {
		case n%3 == 0 && n < 45: // driver A: 15 nodes, 3 GPUs each, in the last 50 minutes
			for g := range 3 {
				faults[g] = gpuFault{now.Add(-time.Duration(n+g) * time.Minute), "XID79"}
			}
		case n == 1 || n == 2: // the background: one GPU each
			faults[5] = gpuFault{now.Add(-20 * time.Minute), "XID48"}
		case n == 4 || n == 5: // older than the window
			faults[6] = gpuFault{now.Add(-3 * time.Hour), "XID79"}
		}
		drained := n >= 50 // rack r5 drained for maintenance: no fault of its cards
		summaries := map[string]gpuhealthv1.GPUSummary{}
		for g := range 8 {
			uuid := fmt.Sprintf("GPU-%08d-0000-0000-0000-%012d", n, g)
			s := gpuhealthv1.GPUSummary{Index: g, Model: "NVIDIA H100 80GB HBM3", Health: health.Healthy.String()}
			if drained {
				since := now.Add(-5 * time.Minute)
				s.Health, s.Reasons, s.Since = health.Unhealthy.String(), []string{health.ReasonAdminDrain}, &since
			}
			if f, ok := faults[g]; ok {
				s.History = gpuhealthv1.SummarizeHistory([]health.HistoryEntry{{Time: f.at, Kind: health.HistoryFault, Reason: f.reason}, {Time: f.at.Add(time.Minute), Kind: health.HistoryReset}})
			}
			// The job: GPUs 6 and 7 of 8 nodes of the other drivers, XID 45 on every one within 3 s.
			// Its pods on GPU 6 name their card; those on GPU 7 hold it through a ResourceClaim.
			if n%3 != 0 && n >= 30 && n < 42 && g >= 6 && len(jobGPUs) < 16 {
				at := now.Add(-10*time.Minute + time.Duration(len(jobGPUs)%4)*time.Second)
				since := at
				s.Health, s.Reasons, s.Since = health.Unhealthy.String(), []string{"XID45"}, &since
				s.XIDFaults = []gpuhealthv1.XIDFault{{XID: 45, Since: at}}
				s.History = gpuhealthv1.SummarizeHistory([]health.HistoryEntry{{Time: at, Kind: health.HistoryFault, Reason: "XID45"}})
				jobGPUs = append(jobGPUs, uuid)
				if g == 6 {
					createJobPod(t, c, name, g, uuid)
				} else {
					createClaimJobPod(t, c, name, g)
				}
			}
			summaries[uuid] = s
		}
		if n%3 != 0 && n >= 30 && n < 42 { // the driver's devices, one per GPU, by UUID
			uuids := slices.Sorted(maps.Keys(summaries))
			if _, err := c.Admin().ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(name, uuids...), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		b, err := json.Marshal(summaries)
		if err != nil {
			t.Fatal(err)
		}
		node.Annotations = map[string]string{gpuhealthv1.HealthKey: string(b)}
		if _, err := c.Admin().CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(jobGPUs) != 16 {
		t.Fatalf("the job holds %d GPUs, want 16", len(jobGPUs))
	}

	out, stderr, code := gpuhealthCLI(t, "fleet", "--kubeconfig", c.AdminKubeconfig(), "--label", rackLabel, "-o", "json")
	if code != 0 {
		t.Fatalf("gpuhealth fleet -o json: exit %d: %s", code, stderr)
	}
	var res sharedcause.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("gpuhealth fleet -o json: %v\n%s", err, out)
	}
	if res.GPUs != 480 || res.FaultyGPUs != 47 {
		t.Errorf("fleet: %d GPUs, %d faulty; want 480 and 47 (45 of driver A, 2 others; the job's 16 explained, 2 too old)", res.GPUs, res.FaultyGPUs)
	}
	var found []string
	for _, f := range res.SharedCauses {
		found = append(found, f.Attribute+"="+f.Value)
	}
	if want := []string{fleet.AttributeDriver + "=" + drivers[0]}; !slices.Equal(found, want) {
		t.Fatalf("shared causes %v, want %v:\n%s", found, want, out)
	}
	if f := res.SharedCauses[0]; f.FaultyGPUs != 45 || f.GPUs != 160 || f.FaultyNodes != 15 || f.Reasons[0].Reason != "XID79" || !f.Since.Equal(now.Add(-44*time.Minute)) {
		t.Errorf("driver A's finding: %+v", f)
	}
	if len(res.Signatures) != 1 || res.Signatures[0].Workload != "podgroup/default/job-1" || res.Signatures[0].Reason != "XID45" || len(res.Signatures[0].GPUs) != 16 {
		t.Errorf("signatures %+v, want job-1's XID45 on 16 GPUs", res.Signatures)
	}

	table, stderr, code := gpuhealthCLI(t, "fleet", "--kubeconfig", c.AdminKubeconfig(), "--label", rackLabel)
	if code != 0 {
		t.Fatalf("gpuhealth fleet: exit %d: %s", code, stderr)
	}
	t.Logf("gpuhealth fleet --label %s:\n%s", rackLabel, table)
	for _, want := range []string{"fleet: 480 GPUs, 47 with a fault in the last 60m", "driver", drivers[0], "45 of 160", "15 of 20", "XID79 (45)", "podgroup/default/job-1", "XID45", "16 of 16"} {
		if !strings.Contains(table, want) {
			t.Errorf("gpuhealth fleet's table lacks %q:\n%s", want, table)
		}
	}
	if _, stderr, code := gpuhealthCLI(t, "fleet", "--kubeconfig", c.AdminKubeconfig(), "--alpha", "2"); code != 2 || !strings.Contains(stderr, "--alpha: must be above 0 and below 1") {
		t.Errorf("gpuhealth fleet --alpha 2: exit %d, %s; want exit 2 naming --alpha", code, stderr)
	}

	// An operator who may read Nodes but not pods gets the judgement, told that it has no
	// workloads (the job's faults then count as its GPUs').
	nodeReader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "fleet-node-reader"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}}}}
	if _, err := c.Admin().RbacV1().ClusterRoles().Create(ctx, nodeReader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet-node-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: nodeReader.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "operator"}},
	}
	if _, err := c.Admin().RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.UserConfig("operator")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "operator.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the operator's RBAC", func(context.Context) (bool, string, error) {
		out, stderr, code := gpuhealthCLI(t, "fleet", "--kubeconfig", kubeconfig)
		return code == 0 && strings.Contains(out, "workloads: unknown (you may not list pods)") && strings.Contains(out, "fleet: 480 GPUs, 63 with a fault"), out + stderr, nil
	})
}

// createJobPod creates a running pod of job-1's PodGroup on node, on its card index (uuid).
func createJobPod(t *testing.T, c *controlplane.Cluster, node string, index int, uuid string) {
	t.Helper()
	ctx := t.Context()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: metav1.NamespaceDefault}}
	if _, err := c.Admin().CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("job-1-%s-%d", node, index), Namespace: metav1.NamespaceDefault,
			Annotations: map[string]string{"scheduling.k8s.io/group-name": "job-1", gpuhealthv1.PodGPUUUIDKey: uuid},
		},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.com/job:1"}}},
	}
	created, err := c.Admin().CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Phase = corev1.PodRunning
	if _, err := c.Admin().CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createClaimJobPod creates a running pod of job-1's PodGroup on node that names no card but
// holds the GPU of device index (controlplane.GPUResourceSlice's) through a ResourceClaim made
// from a template, allocated as the scheduler would.
func createClaimJobPod(t *testing.T, c *controlplane.Cluster, node string, index int) {
	t.Helper()
	ctx := t.Context()
	name := fmt.Sprintf("job-1-%s-%d", node, index)
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu", Namespace: metav1.NamespaceDefault},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
			{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: controlplane.GPUDriver}},
		}}},
	}
	claims := c.Admin().ResourceV1().ResourceClaims(claim.Namespace)
	created, err := claims.Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: controlplane.GPUDriver, Pool: node, Device: controlplane.GPUDeviceName(index)},
	}}}
	if _, err := claims.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	template := "job-1-gpu"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault, Annotations: map[string]string{"scheduling.k8s.io/group-name": "job-1"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.com/job:1"}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &template}}},
	}
	createdPod, err := c.Admin().CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	createdPod.Status.Phase = corev1.PodRunning
	createdPod.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: &claim.Name}}
	if _, err := c.Admin().CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, createdPod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
