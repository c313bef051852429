package main

// Work arriving: the pods submitted, and where the schedulers put them and why.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// sayAllocatable prints each kubelet's nvidia.com/gpu allocatable: the device plugins' healthy
// count as the kubelet's device manager sees it.
func sayAllocatable(ctx context.Context, st *story, admin kubernetes.Interface) error {
	var parts []string
	for _, node := range nodes {
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		capacity, allocatable := n.Status.Capacity[scheduling.ResourceGPU], n.Status.Allocatable[scheduling.ResourceGPU]
		parts = append(parts, fmt.Sprintf("%s %d/%d", node, allocatable.Value(), capacity.Value()))
	}
	st.say("kubelets' nvidia.com/gpu allocatable/capacity: %s", strings.Join(parts, ", "))
	return nil
}

// sayRunning waits for the kubelets to run every scheduled pod and prints which run where.
func sayRunning(ctx context.Context, st *story, admin kubernetes.Interface) error {
	var running []string
	err := waitFor(ctx, "the kubelets to run the scheduled pods", func() (bool, error) {
		pods, err := admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		running = running[:0]
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" {
				continue
			}
			if p.Status.Phase != corev1.PodRunning {
				return false, nil
			}
			running = append(running, p.Name+"@"+p.Spec.NodeName)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	slices.Sort(running)
	st.say("Running (phase from the kubelets, which prepared the DRA claims and called the device plugins' Allocate): %s", strings.Join(running, ", "))
	return nil
}

// submitWork sends pods down both scheduler paths and tells where each landed and why.
func submitWork(ctx context.Context, st *story, admin kubernetes.Interface) error {
	// The DRA path: claims for one GPU each, on the node with the faults. The stock scheduler
	// skips the tainted devices: the story names those tainted when the claims were made.
	tainted, err := taintedDevices(ctx, admin, nodes[0])
	if err != nil {
		return err
	}
	for i := range 2 {
		name := fmt.Sprintf("dra-job-%d", i)
		claim := controlplane.GPUClaim(namespace, name)
		if _, err := admin.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return err
		}
		pod := controlplane.PodWithClaims(namespace, name, name)
		pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: nodes[0]}
		if _, err := admin.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	// The device-plugin path: whole-GPU requests that the extender filters by healthy GPUs.
	wholeGPU := []struct {
		name string
		gpus int64
	}{{"train-8-gpus", 8}, {"train-7-gpus", 7}, {"infer-6-gpus", 6}, {"train-8-gpus-too", 8}}
	for _, w := range wholeGPU {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: w.name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{scheduling.ResourceGPU: *resource.NewQuantity(w.gpus, resource.DecimalSI)}}}}},
		}
		if _, err := admin.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		// One at a time, so the story reads in order.
		if err := waitFor(ctx, "the scheduler to decide on "+w.name, func() (bool, error) {
			p, err := admin.CoreV1().Pods(namespace).Get(ctx, w.name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return p.Spec.NodeName != "" || unschedulable(p) != "", nil
		}); err != nil {
			return err
		}
	}
	names := []string{"dra-job-0", "dra-job-1"}
	for _, w := range wholeGPU {
		names = append(names, w.name)
	}
	if err := waitFor(ctx, "the DRA pods to be scheduled", func() (bool, error) {
		for _, n := range names[:2] {
			p, err := admin.CoreV1().Pods(namespace).Get(ctx, n, metav1.GetOptions{})
			if err != nil || p.Spec.NodeName == "" {
				return false, err
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	nodeList, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	// What earlier pods hold, so each placement is explained as the scheduler saw it.
	used := map[string]*scheduling.Usage{}
	for _, n := range nodes {
		used[n] = &scheduling.Usage{}
	}
	for _, name := range names {
		p, err := admin.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(name, "dra-"):
			claim, err := admin.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			st.say("%-18s -> %s, device %s: kube-scheduler's DRA allocator skips the devices gpuhealth tainted (%s)", name, p.Spec.NodeName, allocated(claim), tainted)
		case p.Spec.NodeName != "":
			st.say("%-18s -> %s: %s", name, p.Spec.NodeName, why(p, nodeList.Items, used))
			if hold, ok, _ := scheduling.PodHold(p); ok {
				used[p.Spec.NodeName].Add(hold)
			}
		default:
			st.say("%-18s -> Pending: %s", name, why(p, nodeList.Items, used))
		}
	}
	return nil
}

func allocated(claim *resourcev1.ResourceClaim) string {
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) == 0 {
		return "<none>"
	}
	return claim.Status.Allocation.Devices.Results[0].Device
}

// why explains a placement with the extender's own placement logic: what every node offered.
func why(pod *corev1.Pod, nodes []corev1.Node, used map[string]*scheduling.Usage) string {
	req := scheduling.PodRequest(pod)
	var parts []string
	for i := range nodes {
		n, _ := scheduling.ParseNode(&nodes[i])
		u := used[n.Name]
		if fits, reason := scheduling.Filter(req, &n, *u); !fits {
			parts = append(parts, fmt.Sprintf("%s: %s", n.Name, reason))
		} else {
			parts = append(parts, fmt.Sprintf("%s: fits (%d healthy GPUs free)", n.Name, int64(n.WholeGPUs-n.Unhealthy)-u.GPUs))
		}
	}
	return fmt.Sprintf("needs %d GPUs; %s", req.GPUs, strings.Join(parts, "; "))
}

func unschedulable(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, waitLimit, true, func(context.Context) (bool, error) { return cond() })
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
	return nil
}
