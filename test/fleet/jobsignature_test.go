//go:build e2e

package fleet

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

const (
	// jobGroup is the burst's job: a PodGroup in the default namespace.
	jobGroup    = "train-47"
	jobWorkload = "podgroup/" + metav1.NamespaceDefault + "/" + jobGroup
	// jobRack is the rack the job fills (16 of its 20 nodes, every GPU), so that its burst, were
	// it counted as faults, would make the rack a finding.
	jobRack  = 3
	jobNodes = 16
	// jobXID is the burst's XID: 45, preemptive cleanup, an application error in NVIDIA's catalog.
	jobXID = 45
	// backgroundFaults is how many GPUs outside the job failed in the hour, at random (1%).
	backgroundFaults = 40
)

// xid45Unhealthy is the HealthConfig of a site that treats XID 45 as fatal (until a GPU reset):
// the policy under which one job's XID 45 reaches the judge as faults on every GPU of the job.
const xid45Unhealthy = `apiVersion: gpuhealth.dev/v1alpha1
kind: HealthConfig
xids:
  overrides:
    - xids: [45]
      severity: Unhealthy
`

// TestFleetJobSignature: on GPUHEALTH_FLEET_NODES (at least 500) nodes × 8 GPUs, written as in
// TestFleetSharedCause, with 40 GPUs failed at random in the hour, one job (the PodGroup
// train-47, 80 running pods on 16 nodes of rack r03, each naming its GPUs by
// gpuhealth.dev/gpu-uuid or by volcano.sh/gpu-index: 128 GPUs) logs XID 45 on every one of its
// GPUs within 5 s, 10 minutes ago.
//
//   - Under the default policy, XID 45 is an application error: no GPU of the job turns
//     Unhealthy (each report says so), and the agents record no fault the judge could count: the
//     judge sees the background alone, no finding, no signature.
//   - Under a policy that makes XID 45 Unhealthy (xid45Unhealthy), every GPU of the job reports
//     the fault; the judge makes it the job's one signature (128 GPUs, 128 faults), counts none
//     of them as a GPU's fault, and finds no driver, rack or other group. The same reports judged
//     without the pods (a user who may not list them) make rack r03 a finding: the signature is
//     what keeps one job from looking like a bad rack.
func TestFleetJobSignature(t *testing.T) {
	size := judgedFleetSize(t)
	_, admin := quietCluster(t)
	ctx := t.Context()
	fleet := makeFleet(size)
	labelFleet(fleet)
	job := fleet[jobRack*rackNodes : jobRack*rackNodes+jobNodes]
	jobGPUs := fleetGPUs(job, func(int, *fleetNode) bool { return true })
	rng := rand.New(rand.NewPCG(45, 47))
	others := fleetGPUs(fleet, func(i int, _ *fleetNode) bool { return i < jobRack*rackNodes || i >= jobRack*rackNodes+jobNodes })
	now := time.Now()
	signals := map[*fleetNode][]health.Signal{}
	background := pick(rng, others, backgroundFaults)
	for _, g := range background {
		signals[g.node] = append(signals[g.node], faultSignals(rng, g.uuid(), now)...)
	}
	burst := now.Add(-10 * time.Minute)
	for _, g := range jobGPUs {
		at := burst.Add(time.Duration(rng.Int64N(int64(5 * time.Second))))
		signals[g.node] = append(signals[g.node], health.Signal{Kind: health.SignalXID, Device: g.uuid(), XID: jobXID, Time: at})
	}
	defaults := health.DefaultPolicy()
	before, err := reports(defaults, fleet, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep := &reporter{admin: admin}
	if err := rep.create(ctx, fleet, before); err != nil {
		t.Fatal(err)
	}
	pods, err := createJob(ctx, admin, job)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes created; job %s: %d running pods holding %d GPUs on %d nodes of rack %s", size, jobGroup, pods, len(jobGPUs), len(job), rackOf(jobRack*rackNodes))

	// The default policy: XID 45 turns no GPU Unhealthy and is no fault.
	writeReports(t, rep, defaults, fleet, signals, "default policy")
	assertJobHealth(t, admin, jobGPUs, false)
	j, err := judgeCluster(ctx, admin, time.Now(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("default policy: %s; %d signatures", figures(j), len(j.res.Signatures))
	if len(j.res.SharedCauses) != 0 || len(j.res.Signatures) != 0 || j.res.FaultyGPUs != backgroundFaults {
		t.Errorf("default policy: findings %v, signatures %+v, %d faulty GPUs; want none, none and the %d of the background",
			findings(j.res), j.res.Signatures, j.res.FaultyGPUs, backgroundFaults)
	}

	// A site that treats XID 45 as fatal: the burst reaches the judge, as the job's signature.
	cfg, err := config.Parse([]byte(xid45Unhealthy))
	if err != nil {
		t.Fatal(err)
	}
	strict, err := cfg.Policy()
	if err != nil {
		t.Fatal(err)
	}
	writeReports(t, rep, strict, fleet, signals, "XID 45 Unhealthy")
	assertJobHealth(t, admin, jobGPUs, true)
	j, err = judgeCluster(ctx, admin, time.Now(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("XID 45 Unhealthy: %s; signatures %s", figures(j), signatures(j))
	checkSignature(t, j, jobGPUs)

	blind, err := judgeCluster(ctx, admin, time.Now(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("XID 45 Unhealthy, judged without the pods: %s", figures(blind))
	if !slices.Contains(findings(blind.res), rackLabel+"="+rackOf(jobRack*rackNodes)) {
		t.Errorf("without the pods, findings %v: want rack %s among them (else the signature proves nothing)", findings(blind.res), rackOf(jobRack*rackNodes))
	}
}

// writeReports writes every node's report under policy after signals, and logs how long it took.
func writeReports(t *testing.T, rep *reporter, policy *health.Policy, fleet []*fleetNode, signals map[*fleetNode][]health.Signal, what string) {
	t.Helper()
	r, err := reports(policy, fleet, signals)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	patched, err := rep.write(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d nodes' reports patched in %.2fs", what, patched, time.Since(start).Seconds())
}

// checkSignature checks the judgement of the job's burst under xid45Unhealthy: one signature,
// the job's, spanning its GPUs; none of them counted as faulty; no finding.
func checkSignature(t *testing.T, j judgement, jobGPUs []gpuRef) {
	t.Helper()
	res := j.res
	want := make([]string, len(jobGPUs))
	for i, g := range jobGPUs {
		want[i] = g.uuid()
	}
	slices.Sort(want)
	if len(res.Signatures) != 1 {
		t.Fatalf("signatures %s, want the job's one", signatures(j))
	}
	s := res.Signatures[0]
	if s.Workload != jobWorkload || s.Reason != "XID45" || !slices.Equal(s.GPUs, want) || s.WorkloadGPUs != len(want) || s.Faults != len(want) || s.Last.Sub(s.First) > 5*time.Second {
		t.Errorf("signature %s: want %s, XID45, on its %d GPUs, %d faults within 5s", signatures(j), jobWorkload, len(want), len(want))
	}
	if len(res.SharedCauses) != 0 {
		t.Errorf("findings %v: the job's burst is no group's fault, and the background no group's either", findings(res))
	}
	if res.FaultyGPUs != backgroundFaults {
		t.Errorf("the judge counted %d faulty GPUs, want the %d of the background (none of the job's)", res.FaultyGPUs, backgroundFaults)
	}
	for _, u := range want {
		if !res.Explained(u) {
			t.Errorf("GPU %s of the job: not explained by the signature", u)
		}
	}
}

// assertJobHealth reads the job's nodes back and checks what their reports say of the job's
// GPUs: Unhealthy with reason XID45, or not Unhealthy (and not in volcano.sh/gpu-unhealthy-ids).
func assertJobHealth(t *testing.T, admin kubernetes.Interface, jobGPUs []gpuRef, unhealthy bool) {
	t.Helper()
	nodes := map[string]*corev1.Node{}
	for _, g := range jobGPUs {
		n, ok := nodes[g.node.name]
		if !ok {
			var err error
			if n, err = admin.CoreV1().Nodes().Get(t.Context(), g.node.name, metav1.GetOptions{}); err != nil {
				t.Fatal(err)
			}
			nodes[g.node.name] = n
		}
		summaries, err := gpuhealthv1.ParseHealth(n.Annotations[gpuhealthv1.HealthKey])
		if err != nil {
			t.Fatal(err)
		}
		s := summaries[g.uuid()]
		ids := strings.Split(n.Annotations[gpuhealthv1.UnhealthyIDsKey], ",")
		listed := slices.Contains(ids, strconv.Itoa(g.gpu))
		isUnhealthy := s.Health == health.Unhealthy.String()
		if isUnhealthy != unhealthy || listed != unhealthy || (unhealthy && !slices.Contains(s.Reasons, "XID45")) {
			t.Fatalf("GPU %s of %s: health %s, reasons %v, listed unhealthy %t; want Unhealthy (XID45) %t", g.uuid(), g.node.name, s.Health, s.Reasons, listed, unhealthy)
		}
	}
}

// createJob creates the job's running pods on its nodes: on the even nodes one pod per GPU,
// naming it by gpuhealth.dev/gpu-uuid; on the odd ones two pods of four GPUs, naming them by
// volcano.sh/gpu-index. It returns how many pods it created.
func createJob(ctx context.Context, admin kubernetes.Interface, job []*fleetNode) (int, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: metav1.NamespaceDefault}}
	if _, err := admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return 0, err
	}
	var pods []*corev1.Pod
	for i, n := range job {
		if i%2 == 0 {
			for g, u := range n.uuids {
				pods = append(pods, jobPod(n.name, g, map[string]string{gpuhealthv1.PodGPUUUIDKey: u}))
			}
			continue
		}
		pods = append(pods, jobPod(n.name, 0, map[string]string{gpuhealthv1.PodGPUIndexKey: "0,1,2,3"}),
			jobPod(n.name, 1, map[string]string{gpuhealthv1.PodGPUIndexKey: "4,5,6,7"}))
	}
	for _, p := range pods {
		created, err := admin.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return 0, err
		}
		created.Status.Phase = corev1.PodRunning
		if _, err := admin.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return 0, err
		}
	}
	return len(pods), nil
}

// jobPod is the k-th pod of the job on node, with cards, its GPU annotations.
func jobPod(node string, k int, cards map[string]string) *corev1.Pod {
	ann := map[string]string{"scheduling.k8s.io/group-name": jobGroup}
	maps.Copy(ann, cards)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", jobGroup, node, k), Namespace: metav1.NamespaceDefault, Annotations: ann},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "train", Image: "example.com/train:1"}}},
	}
}

// signatures is a judgement's signatures as the log shows them.
func signatures(j judgement) string {
	if len(j.res.Signatures) == 0 {
		return "none"
	}
	var parts []string
	for _, s := range j.res.Signatures {
		parts = append(parts, fmt.Sprintf("%s %s on %d of its %d GPUs, %d faults within %v", s.Workload, s.Reason, len(s.GPUs), s.WorkloadGPUs, s.Faults, s.Last.Sub(s.First).Round(time.Millisecond)))
	}
	return strings.Join(parts, "; ")
}
