package controlplane

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// TaintNodeNotReady is the taint kube-apiserver's TaintNodesByCondition admission puts on every
// new Node until something (normally the node lifecycle controller) sees it Ready.
const TaintNodeNotReady = "node.kubernetes.io/not-ready"

// CreateReadyNode registers a fake node the scheduler will place pods on: it creates Node(name)
// with extra labels, sets a Ready status with generous CPU, memory and pod capacity (the
// scheduler refuses nodes with zero allocatable pods), and removes the
// node.kubernetes.io/not-ready:NoSchedule taint that admission adds to new nodes. The node
// lifecycle controller is off by default (see DefaultControllers), so the node stays Ready
// without heartbeats. Everything is done with the node's own kubelet identity, so the Node
// authorizer and NodeRestriction admission are exercised as with a real kubelet.
func (c *Cluster) CreateReadyNode(ctx context.Context, name string, labels map[string]string) (*corev1.Node, error) {
	cfg, err := c.NodeConfig(name)
	if err != nil {
		return nil, err
	}
	kubelet, err := newClientset(cfg, "system:node:"+name)
	if err != nil {
		return nil, err
	}
	node := Node(name)
	maps.Copy(node.Labels, labels)
	node, err = kubelet.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", name, err)
	}

	now := metav1.Now()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(64, resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(512<<30, resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(110, resource.DecimalSI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(1<<40, resource.BinarySI),
	}
	node.Status = corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			nodeCondition(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "fake kubelet is posting ready status", now),
			nodeCondition(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "", now),
			nodeCondition(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "", now),
			nodeCondition(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "", now),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
			{Type: corev1.NodeHostName, Address: name},
		},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion:          KubernetesVersion,
			OperatingSystem:         "linux",
			Architecture:            "amd64",
			ContainerRuntimeVersion: "fake://1.0.0",
		},
	}
	// In a cluster with real nodes the node-lifecycle controller may taint the new Node between
	// Create and this update; NodeRestriction then refuses an update that carries the older
	// taints ("not allowed to modify taints"), so apply the status to a fresh copy and retry.
	status := node.Status
	err = retry.OnError(retry.DefaultRetry, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsForbidden(err) && strings.Contains(err.Error(), "taints")
	}, func() error {
		current, err := kubelet.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		current.Status = status
		node, err = kubelet.CoreV1().Nodes().UpdateStatus(ctx, current, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("set node %s Ready: %w", name, err)
	}

	// NodeRestriction forbids a kubelet to change its taints after registration; removing the
	// not-ready taint is the node lifecycle controller's job, so the admin does it here.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := c.adminClient.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		taints := slices.DeleteFunc(slices.Clone(current.Spec.Taints), func(t corev1.Taint) bool {
			return t.Key == TaintNodeNotReady
		})
		if len(taints) == len(current.Spec.Taints) {
			node = current
			return nil
		}
		current.Spec.Taints = taints
		node, err = c.adminClient.CoreV1().Nodes().Update(ctx, current, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("remove %s taint from node %s: %w", TaintNodeNotReady, name, err)
	}
	return node, nil
}

func nodeCondition(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string, now metav1.Time) corev1.NodeCondition {
	return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
}
