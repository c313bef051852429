package extender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
)

// Bind binds a pod to the node the scheduler chose. For a GPU-sharing pod it first chooses a
// healthy card with room and records it on the pod (volcano.sh/gpu-index and, when the agent
// reported one, gpuhealth.dev/gpu-uuid), so the device plugin and Volcano know which card to
// use. What the pod holds is charged at once, before the pod informer sees the binding, so the
// next pod's filter already counts it.
func (s *Server) Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) error {
	if !s.opts.Bind {
		return errors.New("binding is off (start the extender with --bind)")
	}
	if args.PodName == "" || args.PodNamespace == "" || args.Node == "" {
		return errors.New("binding request needs PodName, PodNamespace and Node")
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(args.PodNamespace, args.PodName), "node", args.Node)
	pods := s.client.CoreV1().Pods(args.PodNamespace)
	pod, err := pods.Get(ctx, args.PodName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read pod: %w", err)
	}
	if args.PodUID != "" && pod.UID != args.PodUID {
		return fmt.Errorf("pod %s/%s is now UID %s, not %s", args.PodNamespace, args.PodName, pod.UID, args.PodUID)
	}
	if err := s.checkBind(pod, args.Node); err != nil {
		logger.Info("Refused to bind", "reason", err.Error())
		return err
	}
	hold, uuid, err := s.reserve(ctx, pod, args.Node)
	if err != nil {
		return err
	}
	if hold.Card != scheduling.NoCard {
		logger = logger.WithValues("card", hold.Card, "uuid", uuid)
	}

	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
	}
	if err := pods.Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		s.state.forget(pod.UID)
		return fmt.Errorf("bind: %w", err)
	}
	if s.requeue != nil {
		s.requeue.forget(pod.UID) // bound: nothing to retry
	}
	logger.V(2).Info("Bound pod")
	return nil
}

// reserve charges what pod holds to node before the Binding exists (Bind undoes it if the
// Binding fails; the pod informer's own event for the bound pod replaces the entry, same UID).
// For a GPU-sharing pod it first chooses the card and records it on the pod. All of it happens
// under bindMu, so that two binds never choose the same last free memory; uuid is the chosen
// card's, when the agent reported one.
// checkBind refuses what kube-scheduler would never ask: a pod that is not pending and unbound,
// or that asks for another scheduler, or a node that does not pass the filter now. /bind binds
// with the extender's own pods/binding right, so the request is checked, not trusted.
func (s *Server) checkBind(pod *corev1.Pod, node string) error {
	switch {
	case pod.DeletionTimestamp != nil:
		return fmt.Errorf("pod %s/%s is being deleted", pod.Namespace, pod.Name)
	case pod.Spec.NodeName != "":
		return fmt.Errorf("pod %s/%s is already bound to %s", pod.Namespace, pod.Name, pod.Spec.NodeName)
	case pod.Status.Phase != "" && pod.Status.Phase != corev1.PodPending:
		return fmt.Errorf("pod %s/%s is %s, not Pending", pod.Namespace, pod.Name, pod.Status.Phase)
	case !slices.Contains(s.opts.SchedulerNames, schedulerName(pod)):
		return fmt.Errorf("pod %s/%s asks for scheduler %q; this extender serves %s", pod.Namespace, pod.Name, schedulerName(pod), strings.Join(s.opts.SchedulerNames, ", "))
	}
	req := scheduling.PodRequest(pod)
	var (
		fits   bool
		reason string
	)
	s.state.read(func(v view) {
		cached, used := v.cached(node)
		fits, reason, _ = s.judge(s.judgeNow(&scheduling.Judge{}), req, cached, used)
	})
	if !fits {
		return fmt.Errorf("node %s does not pass the filter now: %s", node, reason)
	}
	return nil
}

// schedulerName is the scheduler a pod asks for ("default-scheduler" when it names none).
func schedulerName(pod *corev1.Pod) string {
	if pod.Spec.SchedulerName == "" {
		return corev1.DefaultSchedulerName
	}
	return pod.Spec.SchedulerName
}

func (s *Server) reserve(ctx context.Context, pod *corev1.Pod, node string) (hold scheduling.Hold, uuid string, err error) {
	req := scheduling.PodRequest(pod)
	hold = scheduling.Hold{Node: node, GPUs: req.GPUs, Card: scheduling.NoCard}
	s.bindMu.Lock()
	defer s.bindMu.Unlock()
	if req.MemoryMiB > 0 {
		var card int
		card, uuid, err = s.state.place(req, node)
		if err != nil {
			return hold, "", err
		}
		if err := s.recordCard(ctx, pod, card, uuid); err != nil {
			return hold, "", err
		}
		hold.Card, hold.MemoryMiB = card, req.MemoryMiB
	}
	if !req.IsZero() {
		s.state.assume(pod.UID, hold)
	}
	return hold, uuid, nil
}

// recordCard writes the chosen card on the pod with a merge patch that carries the pod's UID, so
// it cannot land on a recreated pod of the same name.
func (s *Server) recordCard(ctx context.Context, pod *corev1.Pod, card int, uuid string) error {
	ann := map[string]any{scheduling.GPUIndexAnnotation: strconv.Itoa(card)}
	if uuid != "" {
		ann[scheduling.GPUUUIDAnnotation] = uuid
	} else {
		ann[scheduling.GPUUUIDAnnotation] = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID, "annotations": ann}})
	if err != nil {
		return err
	}
	if _, err := s.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("record card %d on the pod: %w", card, err)
	}
	return nil
}
