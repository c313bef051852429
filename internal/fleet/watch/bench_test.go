package watch

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/fleet"
)

// heldBytes returns the heap that build(i) for i in [0, n) holds, per object.
func heldBytes(n int, build func(i int) any) float64 {
	held := make([]any, n)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range held {
		held[i] = build(i)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(held)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

// gpuNode is a GPU node as the API server serves it: GPU feature discovery's and node feature
// discovery's labels, its agent's report of 8 GPUs (two with a fault in their history), the
// kubelet's status with its images, and the managed fields.
func gpuNode(i int) *corev1.Node {
	n := testNode(&testing.T{}, i, []fault{{n: i, g: 0, at: t0, reason: "XID79"}, {n: i, g: 3, at: t0, reason: "XID48"}})
	n.Name = fmt.Sprintf("gpu-node-%05d", i)
	for l := range 60 {
		n.Labels[fmt.Sprintf("feature.node.kubernetes.io/cpu-cpuid.FEATURE%d", l)] = "true"
	}
	for l := range 25 {
		n.Labels[fmt.Sprintf("nvidia.com/gpu.label-%d", l)] = "NVIDIA-H100-80GB-HBM3"
	}
	n.Annotations["nfd.node.kubernetes.io/feature-labels"] = fmt.Sprintf("%0500d", i)
	n.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"] = "true"
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fmt.Sprintf("%02000d", i))}}
	n.Status.Capacity = corev1.ResourceList{"cpu": resource.MustParse("192"), "memory": resource.MustParse("2Ti"), "nvidia.com/gpu": resource.MustParse("8")}
	n.Status.Allocatable = n.Status.Capacity.DeepCopy()
	for c := range 8 {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeConditionType(fmt.Sprintf("Condition%d", c)),
			Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"})
	}
	for im := range 40 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{
			fmt.Sprintf("nvcr.io/nvidia/image-%d@sha256:%064d", im, im), fmt.Sprintf("nvcr.io/nvidia/image-%d:v24.%d", im, im)}, SizeBytes: 1 << 30})
	}
	n.Status.NodeInfo = corev1.NodeSystemInfo{KernelVersion: "6.8.0-1015-nvidia", OSImage: "Ubuntu 24.04 LTS", ContainerRuntimeVersion: "containerd://2.0.0",
		KubeletVersion: "v1.34.0", MachineID: fmt.Sprintf("%032d", i), SystemUUID: fmt.Sprintf("%036d", i), BootID: fmt.Sprintf("%036d", i)}
	return n
}

// appPod is a pod as the API server serves it: two containers with their environment and mounts,
// their statuses, and the managed fields; with index >= 0, a GPU-sharing pod of a job on that card.
func appPod(i, index int) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%06d-x7k2p", i), Namespace: "team-a", UID: "0b1c2d3e-0000-4000-8000-000000000000",
		Labels:          map[string]string{"app.kubernetes.io/name": "app", "pod-template-hash": "5d8f7c9b6"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "app-5d8f7c9b6", Controller: new(bool)}},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fmt.Sprintf("%01500d", i))}}},
		Spec: corev1.PodSpec{NodeName: fmt.Sprintf("gpu-node-%05d", i/20)}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for c := range 2 {
		ctr := corev1.Container{Name: fmt.Sprintf("c%d", c), Image: "registry.example.com/team-a/app:v1.2.3",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": resource.MustParse("1"), "memory": resource.MustParse("1Gi")}}}
		for e := range 12 {
			ctr.Env = append(ctr.Env, corev1.EnvVar{Name: fmt.Sprintf("APP_SETTING_%d", e), Value: "some-value-of-moderate-length"})
		}
		for m := range 3 {
			ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: fmt.Sprintf("v%d", m), MountPath: fmt.Sprintf("/var/run/app/v%d", m)})
		}
		p.Spec.Containers = append(p.Spec.Containers, ctr)
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: ctr.Name, Image: ctr.Image,
			ImageID: fmt.Sprintf("registry.example.com/team-a/app@sha256:%064d", c), ContainerID: fmt.Sprintf("containerd://%064d", i), Ready: true})
	}
	if index >= 0 {
		p.Annotations = map[string]string{"scheduling.k8s.io/group-name": fmt.Sprintf("job-%d", i/64), "volcano.sh/gpu-index": fmt.Sprint(index)}
	}
	return p
}

// BenchmarkCacheMemory measures what the Watcher's caches keep of each object, against the
// object as decoded (what a plain informer keeps): B/node-full and B/node-cached for a GPU node,
// B/pod-full for a pod, B/pod-cached for a pod that names no card and B/workload-pod-cached for
// one that does. Each iteration transforms one node and one pod.
func BenchmarkCacheMemory(b *testing.B) {
	const n = 2000
	metrics := map[string]float64{
		"B/node-full":           heldBytes(n, func(i int) any { return gpuNode(i) }),
		"B/node-cached":         heldBytes(n, func(i int) any { return fleet.CollectedNode(gpuNode(i), []string{"example.com/rack"}) }),
		"B/pod-full":            heldBytes(n, func(i int) any { return appPod(i, -1) }),
		"B/pod-cached":          storeBytes(n, -1),
		"B/workload-pod-cached": storeBytes(n, 3),
	}
	node, pod, c := gpuNode(0), appPod(0, 3), newPodCache()
	for b.Loop() {
		fleet.CollectedNode(node, []string{"example.com/rack"})
		_ = c.Add(pod)
	}
	for unit, v := range metrics { // after the loop, which resets what was reported before it
		b.ReportMetric(v, unit)
	}
}

// storeBytes is what a podCache holds per pod after n pods were added (on card index, or none).
func storeBytes(n, index int) float64 {
	c := newPodCache()
	return heldBytes(1, func(int) any {
		for i := range n {
			_ = c.Add(appPod(i, index))
		}
		return c
	}) / float64(n)
}
