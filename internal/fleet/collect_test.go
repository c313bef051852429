package fleet

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func node(t *testing.T, name string, labels map[string]string, summaries map[string]gpuhealthv1.GPUSummary) corev1.Node {
	t.Helper()
	b, err := json.Marshal(summaries)
	if err != nil {
		t.Fatal(err)
	}
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{gpuhealthv1.HealthKey: string(b)}}}
}

func TestCollect(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	since := t0.Add(30 * time.Second)
	older := t0.Add(-time.Hour)
	nodes := []corev1.Node{
		node(t, "a", map[string]string{DriverVersionLabel: "580.95.05", "nvidia.com/gpu.clique": "c1.0", corev1.LabelTopologyZone: "z1", "rack": "r1"}, map[string]gpuhealthv1.GPUSummary{
			"GPU-a0": {Index: 0, Model: "H100", VBIOS: "96.00.89.00.01", Health: "Healthy", History: gpuhealthv1.SummarizeHistory([]health.HistoryEntry{
				{Time: older, Kind: health.HistoryFault, Reason: "XID48"}, {Time: older.Add(time.Minute), Kind: health.HistoryReset},
			})},
			// Unhealthy now with XID 79, which is the history's newest fault: counted once.
			// Flashed apart from its neighbours: its own VBIOS version is its attribute.
			"GPU-a1": {Index: 1, Model: "H100", VBIOS: "96.00.74.00.0B", Health: "Unhealthy", Reasons: []string{"XID79"}, Since: &since, XIDFaults: []gpuhealthv1.XIDFault{{XID: 79, Since: since}},
				History: gpuhealthv1.SummarizeHistory([]health.HistoryEntry{{Time: since.Add(400 * time.Millisecond), Kind: health.HistoryFault, Reason: "XID79"}})},
			// An XID fault in effect that the history no longer holds: counted.
			"GPU-a2": {Index: 2, Model: "H100", Health: "Unhealthy", Reasons: []string{"XID48"}, Since: &since, XIDFaults: []gpuhealthv1.XIDFault{{XID: 48, Since: since}}},
			// Not faults of the card: a drain, a warm GPU.
			"GPU-a3":               {Index: 3, Model: "H100", Health: "Unhealthy", Reasons: []string{"AdminDrain"}, Since: &since},
			"GPU-a4":               {Index: 4, Model: "H100", Health: "Degraded", Reasons: []string{"TemperatureAtSlowdown"}, Since: &since},
			"MIG-a0/1":             {Index: 0, ParentUUID: "GPU-a0", Health: "Healthy"},
			"MISSING-0000:99:00.0": {Index: -1, Missing: true, Health: "Unhealthy"},
		}),
		node(t, "b", map[string]string{driverMajorLabel: "575", driverMinorLabel: "57", driverRevLabel: "08"}, map[string]gpuhealthv1.GPUSummary{
			"GPU-b0": {Index: 0, Model: "H100", Health: "Healthy"},
			"GPU-b1": {Index: 1, Model: "H100", Health: "Healthy"},
		}),
		{ObjectMeta: metav1.ObjectMeta{Name: "no-agent"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "garbled", Annotations: map[string]string{gpuhealthv1.HealthKey: "{"}}},
	}
	controller := true
	pods := []corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "ns", Annotations: map[string]string{"scheduling.k8s.io/group-name": "g", gpuhealthv1.PodGPUIndexKey: "0,1"}}, Spec: corev1.PodSpec{NodeName: "a"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "p2", Namespace: "ns", Labels: map[string]string{"scheduling.x-k8s.io/pod-group": "g"}, Annotations: map[string]string{gpuhealthv1.PodGPUUUIDKey: "GPU-b0"}}, Spec: corev1.PodSpec{NodeName: "b"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "p3", Namespace: "ns", OwnerReferences: []metav1.OwnerReference{{Kind: "Job", Name: "train", Controller: &controller}}, Annotations: map[string]string{gpuhealthv1.PodGPUIndexKey: "1"}}, Spec: corev1.PodSpec{NodeName: "b"}},
		// Left out: no workload, not placed, finished, a card index that is not one.
		{ObjectMeta: metav1.ObjectMeta{Name: "alone", Namespace: "ns", Annotations: map[string]string{gpuhealthv1.PodGPUIndexKey: "2"}}, Spec: corev1.PodSpec{NodeName: "a"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "pending", Namespace: "ns", Annotations: map[string]string{"scheduling.k8s.io/group-name": "h", gpuhealthv1.PodGPUIndexKey: "0"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "done", Namespace: "ns", Annotations: map[string]string{"scheduling.k8s.io/group-name": "h", gpuhealthv1.PodGPUIndexKey: "0"}}, Spec: corev1.PodSpec{NodeName: "a"}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
		{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "ns", Annotations: map[string]string{"scheduling.k8s.io/group-name": "h", gpuhealthv1.PodGPUIndexKey: "x"}}, Spec: corev1.PodSpec{NodeName: "a"}},
	}
	got := Collect(nodes, pods, []string{"rack"})

	var uuids []string
	for _, g := range got.Fleet.GPUs {
		uuids = append(uuids, g.UUID)
	}
	if want := []string{"GPU-a0", "GPU-a1", "GPU-a2", "GPU-a3", "GPU-a4", "GPU-b0", "GPU-b1"}; !slices.Equal(uuids, want) {
		t.Errorf("GPUs %v, want %v (no MIG instance, no missing GPU)", uuids, want)
	}
	wantA := map[string]string{AttributeDriver: "580.95.05", AttributeModel: "H100", AttributeVBIOS: "96.00.89.00.01", AttributeNVLinkDomain: "c1.0",
		AttributeZone: "z1", "rack": "r1"}
	if a := got.Fleet.GPUs[0].Attributes; !maps.Equal(a, wantA) {
		t.Errorf("node a's attributes %v, want %v", a, wantA)
	}
	// Each GPU's VBIOS is its own; a report without one (an older agent) gives none, in no group.
	for i, want := range map[int]string{1: "96.00.74.00.0B", 2: "", 5: ""} {
		if v := got.Fleet.GPUs[i].Attributes[AttributeVBIOS]; v != want {
			t.Errorf("%s's VBIOS %q, want %q", got.Fleet.GPUs[i].UUID, v, want)
		}
	}
	if d := got.Fleet.GPUs[5].Attributes[AttributeDriver]; d != "575.57.08" {
		t.Errorf("node b's driver %q, want 575.57.08 from the major, minor and revision labels", d)
	}
	wantFaults := []sharedcause.Fault{
		{GPU: "GPU-a0", Time: older, Reason: "XID48"},
		{GPU: "GPU-a1", Time: since.Add(400 * time.Millisecond), Reason: "XID79"},
		{GPU: "GPU-a2", Time: since, Reason: "XID48"},
	}
	if !slices.EqualFunc(got.Fleet.Faults, wantFaults, func(a, b sharedcause.Fault) bool {
		return a.GPU == b.GPU && a.Time.Equal(b.Time) && a.Reason == b.Reason
	}) {
		t.Errorf("faults %+v, want %+v", got.Fleet.Faults, wantFaults)
	}
	wantWork := map[string][]string{"podgroup/ns/g": {"GPU-a0", "GPU-a1", "GPU-b0"}, "job/ns/train": {"GPU-b1"}}
	if len(got.Fleet.Workloads) != len(wantWork) {
		t.Errorf("workloads %v, want %v", got.Fleet.Workloads, wantWork)
	}
	for k, v := range wantWork {
		if !slices.Equal(got.Fleet.Workloads[k], v) {
			t.Errorf("workload %s: %v, want %v", k, got.Fleet.Workloads[k], v)
		}
	}
	if len(got.Skipped) != 1 || !strings.HasPrefix(got.Skipped[0], "garbled: ") {
		t.Errorf("skipped %q, want the garbled node alone", got.Skipped)
	}
}

// TestCollectFromWhatACacheKeeps: what CollectedNode keeps of the Nodes and WorkloadPodOf of the
// pods collect exactly what the whole objects do.
func TestCollectFromWhatACacheKeeps(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	since := t0.Add(30 * time.Second)
	gpus := map[string]gpuhealthv1.GPUSummary{
		"GPU-c0": {Index: 0, Model: "H100", VBIOS: "96.00.89.00.01", Health: "Unhealthy", Reasons: []string{"XID79"}, Since: &since, XIDFaults: []gpuhealthv1.XIDFault{{XID: 79, Since: since}}},
		"GPU-c1": {Index: 1, Model: "H100", Health: "Healthy"},
	}
	full := node(t, "c", map[string]string{DriverVersionLabel: "580.95.05", driverMajorLabel: "580", "nvidia.com/gpu.clique": "c1.0",
		corev1.LabelTopologyZone: "z1", "rack": "r1", "kubernetes.io/hostname": "c", "nvidia.com/gpu.product": "H100"}, gpus)
	full.Annotations["node.alpha.kubernetes.io/ttl"] = "0"
	full.Status.Capacity = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}
	nodes := []corev1.Node{full, node(t, "d", map[string]string{driverMajorLabel: "575", driverMinorLabel: "57"}, gpus), {ObjectMeta: metav1.ObjectMeta{Name: "bare"}}}
	pods := []corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "ns", Annotations: map[string]string{"scheduling.k8s.io/group-name": "g", gpuhealthv1.PodGPUIndexKey: "0,1"}}, Spec: corev1.PodSpec{NodeName: "c"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "p2", Namespace: "ns", Labels: map[string]string{"pod-group.scheduling.sigs.k8s.io": "g"}, Annotations: map[string]string{gpuhealthv1.PodGPUUUIDKey: "GPU-c1"}}, Spec: corev1.PodSpec{NodeName: "d"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "alone", Namespace: "ns", Annotations: map[string]string{gpuhealthv1.PodGPUIndexKey: "1"}}, Spec: corev1.PodSpec{NodeName: "c"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "no-card", Namespace: "ns", Annotations: map[string]string{"scheduling.k8s.io/group-name": "g"}}, Spec: corev1.PodSpec{NodeName: "c"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "failed", Namespace: "ns", Annotations: map[string]string{"scheduling.k8s.io/group-name": "g", gpuhealthv1.PodGPUIndexKey: "0"}}, Spec: corev1.PodSpec{NodeName: "c"}, Status: corev1.PodStatus{Phase: corev1.PodFailed}},
	}
	want := Collect(nodes, pods, []string{"rack"})

	var cached []*corev1.Node
	for i := range nodes {
		cached = append(cached, CollectedNode(&nodes[i], []string{"rack"}))
	}
	if c := cached[0]; c.Labels["kubernetes.io/hostname"] != "" || c.Annotations["node.alpha.kubernetes.io/ttl"] != "" || c.Status.Capacity != nil {
		t.Errorf("CollectedNode kept what Collect does not read: %+v", c)
	}
	var wps []WorkloadPod
	for i := range pods {
		if wp, ok := WorkloadPodOf(&pods[i]); ok {
			wps = append(wps, wp)
		}
	}
	if len(wps) != 2 {
		t.Errorf("WorkloadPodOf kept %+v, want p1 and p2 alone", wps)
	}
	got := CollectFrom(cached, wps, []string{"rack"})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("collected from the cache:\n%+v\nfrom the objects:\n%+v", got, want)
	}
}

// A bad VBIOS batch is found from the agents' reports alone: five of twenty nodes whose boards
// carry VBIOS B, two faulty GPUs on each, and no fault on the others (VBIOS A, one model, no
// topology labels) make the finding vbios=B, and nothing else.
func TestCollectedVBIOSIsJudged(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	since := now.Add(-10 * time.Minute)
	var nodes []corev1.Node
	for n := range 20 {
		vbios := "96.00.89.00.01"
		if n < 5 {
			vbios = "96.00.89.00.02"
		}
		gpus := map[string]gpuhealthv1.GPUSummary{}
		for i := range 8 {
			s := gpuhealthv1.GPUSummary{Index: i, Model: "H100", VBIOS: vbios, Health: "Healthy"}
			if n < 5 && i < 2 {
				s.Health, s.Reasons, s.Since = "Unhealthy", []string{"XID79"}, &since
				s.XIDFaults = []gpuhealthv1.XIDFault{{XID: 79, Since: since}}
			}
			gpus[fmt.Sprintf("GPU-%02d-%d", n, i)] = s
		}
		nodes = append(nodes, node(t, fmt.Sprintf("n%02d", n), nil, gpus))
	}
	res, err := sharedcause.Judge(now, Collect(nodes, nil, nil).Fleet, sharedcause.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.SharedCauses) != 1 {
		t.Fatalf("findings %+v, want vbios=96.00.89.00.02 alone", res.SharedCauses)
	}
	if f := res.SharedCauses[0]; f.Attribute != AttributeVBIOS || f.Value != "96.00.89.00.02" || f.FaultyGPUs != 10 || f.GPUs != 40 || f.FaultyNodes != 5 {
		t.Errorf("finding %+v, want vbios=96.00.89.00.02 with 10 of its 40 GPUs faulty on 5 nodes", f)
	}
}
