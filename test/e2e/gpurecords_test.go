//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/fleet/records"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestAGPUsPastFollowsItsSerial: GPU 0 of node rec-a (serial GPUREC-1) falls off the bus; the
// breaker controller keeps its life in the GPURecord named by its serial. Node rec-a is deleted
// (re-imaged, say): the record stays. The card reappears as GPU 1 of node rec-b, whose agent reads
// the record when it starts and marks the GPU Degraded / RepeatOffender, naming rec-a; its
// other GPU, with no past, stays Healthy. `gpuhealth history` prints the life by serial and by
// node and index, `gpuhealth status -o wide` its lifetime, and the agent may not write a record.
func TestAGPUsPastFollowsItsSerial(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	installGPURecordCRD(t, c)
	const serial = "GPUREC-1"
	gpuNode(t, c, "rec-a", 2)
	gpuNode(t, c, "rec-b", 2)
	kubeconfigA := agentKubeconfigOnNode(t, c, "rec-a")
	kubeconfigB := agentKubeconfigOnNode(t, c, "rec-b")
	// As the chart grants with fleet.records and fleet.repeatOffender.
	grantClusterRules(t, c, "gpuhealth-agent-gpurecords", "gpuhealth-agent", agent.RecordsClusterRoleRules())
	grantClusterRules(t, c, "gpuhealth-breaker-controller-gpurecords", "gpuhealth-breaker-controller", records.ControllerClusterRoleRules())
	startBreakerControllerWith(t, c, []string{"--config", writeFleetConfig(t, "fleet: {records: {enabled: true}}\n")})
	recs := recordsClient(t, c)

	a := startAgent(t, agentSetup{node: "rec-a", gpus: 2, kubeconfig: kubeconfigA, checkpoint: filepath.Join(t.TempDir(), "a.ckpt"),
		gpusExtra: ", serials: [" + serial + "]", scenario: "events:\n  - {at: 1s, gpu: 0, xid: 79}\n"})
	eventually(t, "the controller records the fault of serial "+serial+" on rec-a", func(ctx context.Context) (bool, string, error) {
		r, err := recs.Get(ctx, gpurecord.NameFor(serial), metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return r.Serial == serial && r.Counts[gpurecord.EventFault] == 1 && len(r.Placements) == 1 && r.Placements[0].Node == "rec-a",
			fmt.Sprintf("%+v", r), nil
	})
	// rec-a's healthy GPU 1 has nothing to remember: no record.
	list, err := recs.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("records: %v, %v; want only %s's", list, err, serial)
	}

	a.stop()
	if err := c.Admin().CoreV1().Nodes().Delete(ctx, "rec-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node rec-a is gone", func(ctx context.Context) (bool, string, error) {
		_, err := c.Admin().CoreV1().Nodes().Get(ctx, "rec-a", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})

	// The card moves to rec-b, as its GPU 1.
	startAgent(t, agentSetup{node: "rec-b", gpus: 2, kubeconfig: kubeconfigB, checkpoint: filepath.Join(t.TempDir(), "b.ckpt"),
		gpusExtra: ", serials: [GPUREC-2, " + serial + "]", topConfig: "fleet:\n  repeatOffender: {faults: 1, within: 24h}\n"})
	eventually(t, "rec-b's GPU 1 arrives Degraded / RepeatOffender, naming rec-a; GPU 0 stays Healthy", func(ctx context.Context) (bool, string, error) {
		n, err := c.Admin().CoreV1().Nodes().Get(ctx, "rec-b", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		summaries, err := gpuhealthv1.ParseHealth(n.Annotations[gpuhealthv1.HealthKey])
		if err != nil {
			return false, err.Error(), nil
		}
		var gpu0, gpu1 gpuhealthv1.GPUSummary
		for _, s := range summaries {
			switch s.Index {
			case 0:
				gpu0 = s
			case 1:
				gpu1 = s
			}
		}
		ok := gpu1.Serial == serial && gpu1.Health == health.Degraded.String() && len(gpu1.Reasons) > 0 && gpu1.Reasons[0] == health.ReasonRepeatOffender &&
			gpu0.Health == health.Healthy.String()
		return ok, fmt.Sprintf("GPU 0 %+v, GPU 1 %+v", gpu0, gpu1), nil
	})
	eventually(t, "a GPURepeatOffender Event names the past on rec-a", func(ctx context.Context) (bool, string, error) {
		evs, err := c.Admin().CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "reason=GPURepeatOffender"})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "rec-b" && strings.Contains(e.Message, "GPU 1: board serial "+serial) && strings.Contains(e.Message, "node rec-a") {
				return true, "", nil
			}
		}
		return false, fmt.Sprint(evs.Items), nil
	})
	eventually(t, "the record says the card is in rec-b now, and still remembers rec-a", func(ctx context.Context) (bool, string, error) {
		r, err := recs.Get(ctx, gpurecord.NameFor(serial), metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return len(r.Placements) == 2 && r.Placements[1].Node == "rec-b" && r.Placements[1].Index == 1, fmt.Sprintf("%+v", r.Placements), nil
	})

	for _, args := range [][]string{{"history", serial}, {"history", "rec-b", "1"}} {
		out, stderr, code := gpuhealthCLI(t, append(args, "--kubeconfig", c.AdminKubeconfig())...)
		if code != 0 || !strings.Contains(out, "GPU "+serial) || !strings.Contains(out, "fault 1") || !strings.Contains(out, "rec-a") ||
			!strings.Contains(out, "rec-b") || !strings.Contains(out, "XID79") {
			t.Errorf("gpuhealth %v: exit %d\n%s%s", args, code, out, stderr)
		}
	}
	out, stderr, code := gpuhealthCLI(t, "status", "-o", "wide", "--kubeconfig", c.AdminKubeconfig())
	if code != 0 || !strings.Contains(out, "LIFETIME") || !strings.Contains(out, "fault 1, 2 nodes") || !strings.Contains(out, health.ReasonRepeatOffender) {
		t.Errorf("status -o wide: exit %d\n%s%s", code, out, stderr)
	}
	if out, _, code := gpuhealthCLI(t, "history", "no such serial", "--kubeconfig", c.AdminKubeconfig()); code == 0 {
		t.Errorf("history of an invalid serial exited 0:\n%s", out)
	}

	// The agent reads records, by name; it may not write or list them.
	agentCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigB)
	if err != nil {
		t.Fatal(err)
	}
	agentRecords, err := kube.NewGPURecords(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agentRecords.Get(ctx, gpurecord.NameFor(serial), metav1.GetOptions{}); err != nil {
		t.Errorf("the agent cannot read a record by name: %v", err)
	}
	forged := &gpurecord.GPURecord{ObjectMeta: metav1.ObjectMeta{Name: "forged"}, Serial: "forged"}
	if _, err := agentRecords.Create(ctx, forged, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent created a record: %v", err)
	}
	if _, err := agentRecords.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent listed the records: %v", err)
	}
}

// installGPURecordCRD creates the chart's GPURecord CRD and waits until records are served.
func installGPURecordCRD(t *testing.T, c *controlplane.Cluster) {
	t.Helper()
	var obj map[string]any
	if err := yaml.Unmarshal(gpurecord.CRD, &obj); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Create(t.Context(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	recs := recordsClient(t, c)
	eventually(t, "GPURecords are served", func(ctx context.Context) (bool, string, error) {
		_, err := recs.List(ctx, metav1.ListOptions{})
		return err == nil, fmt.Sprint(err), nil
	})
}

func recordsClient(t *testing.T, c *controlplane.Cluster) kube.GPURecordInterface {
	t.Helper()
	records, err := kube.NewGPURecords(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return records
}

// grantClusterRules binds ServiceAccount sa of agentNamespace to a ClusterRole name of rules.
func grantClusterRules(t *testing.T, c *controlplane.Cluster, name, sa string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.Admin().RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin().RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: agentNamespace, Name: sa}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// writeFleetConfig writes a HealthConfig with body (its fleet section) for the breaker controller.
func writeFleetConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet-config.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\n"+body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
