package evict

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Deciding, pod by pod, what happens to the pods holding a GPU that asks for eviction: skipped,
// only reported, listed in a dry run, waiting for the grace period, blocked, held by the circuit
// breaker, or evicted.

// gpu evicts what it may of one GPU's pods and returns the pods whose eviction is pending. It
// marks each holder it read in held; ok is false when it could not tell (or read) them all.
func (e *Evictor) gpu(ctx context.Context, t target, now time.Time, held map[types.UID]bool) (_ []gpuhealthv1.PodEviction, ok bool) {
	logger := klog.FromContext(ctx).WithValues("gpu", t.gpu.UUID, "index", t.gpu.Index)
	holders, err := e.find(ctx, t)
	if err != nil {
		// Do not know: nothing of this GPU is evicted; say so once per distinct error.
		e.noticeNode(corev1.EventTypeWarning, "GPUEvictionUnknown",
			fmt.Sprintf("GPU %d (%s) asks for eviction but the pods holding it are unknown, so none is evicted: %v", t.gpu.Index, t.gpu.UUID, err))
		logger.Error(err, "Cannot tell which pods hold the GPU; evicting none")
		return nil, false
	}
	ok = true
	var pending []gpuhealthv1.PodEviction
	var admitted *bool
	for _, h := range holders {
		pod, err := e.opts.Client.CoreV1().Pods(h.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			logger.Error(err, "Cannot read a pod holding the GPU; retrying", "pod", h.String())
			ok = false
			continue
		}
		held[pod.UID] = true
		if reason := e.skip(pod); reason != "" {
			if reason != skipSilently {
				e.noticePod(pod, corev1.EventTypeNormal, "GPUEvictionSkipped",
					fmt.Sprintf("pod holds GPU %d (%s), which asks for eviction; not evicted: %s", t.gpu.Index, t.gpu.UUID, reason))
			}
			continue
		}
		st := e.pods[pod.UID]
		if st == nil {
			st = &podState{since: now}
			e.pods[pod.UID] = st
		}
		entry := gpuhealthv1.PodEviction{Pod: h.String(), Via: h.Via, Since: st.since}
		switch {
		case slices.Contains(e.opts.ReportOnlyNamespaces, pod.Namespace):
			entry.State = gpuhealthv1.EvictionReportOnly
			e.noticePod(pod, corev1.EventTypeWarning, "GPUEvictionReportOnly",
				fmt.Sprintf("pod holds GPU %d (%s), which asks for eviction; namespace %s is report-only", t.gpu.Index, t.gpu.UUID, pod.Namespace))
		case e.opts.DryRun:
			entry.State = gpuhealthv1.EvictionDryRun
			e.noticePod(pod, corev1.EventTypeWarning, "GPUEvictionDryRun",
				fmt.Sprintf("pod holds GPU %d (%s), which asks for eviction; dry run: it would be evicted", t.gpu.Index, t.gpu.UUID))
		case now.Before(e.since[t.gpu.UUID].Add(e.opts.GracePeriod)):
			entry.State = gpuhealthv1.EvictionWaiting
		case st.done || now.Before(st.next):
			if st.done {
				continue
			}
			entry.State = gpuhealthv1.EvictionBlocked
		default:
			if admitted == nil {
				ok := e.admit(ctx, t.gpu)
				admitted = &ok
			}
			if !*admitted {
				entry.State = gpuhealthv1.EvictionHeld
				break
			}
			if e.evict(ctx, pod, h, t.gpu, st, now) {
				continue
			}
			entry.State = gpuhealthv1.EvictionBlocked
		}
		pending = append(pending, entry)
	}
	return pending, ok
}

const skipSilently = "-"

// skip says why a pod is not evicted ("" when it may be).
func (e *Evictor) skip(pod *corev1.Pod) string {
	switch {
	case pod.Spec.NodeName != e.opts.NodeName:
		return skipSilently // the kubelet's answer is stale: not a pod of this node
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil:
		return skipSilently // gone or going
	case pod.Namespace+"/"+pod.Name == e.opts.Self:
		return skipSilently
	case slices.Contains(e.opts.ExcludeNamespaces, pod.Namespace):
		return skipSilently
	case !e.opts.DaemonSetPods && ownedByDaemonSet(pod):
		return "it is a DaemonSet's pod (agent.eviction.daemonSetPods is off)"
	}
	return ""
}

func ownedByDaemonSet(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller
	})
}

func (e *Evictor) admit(ctx context.Context, gpu health.Device) bool {
	if e.opts.Breaker == nil {
		return true
	}
	ok, err := e.opts.Breaker.Admit(ctx, gpu.UUID)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Circuit breaker; holding the GPU's evictions", "gpu", gpu.UUID)
		return false
	}
	if !ok {
		e.noticeNode(corev1.EventTypeWarning, "GPUEvictionHeld",
			fmt.Sprintf("GPU %d (%s) asks for eviction, but the circuit breaker's budget is spent: its pods stay until it is acknowledged (`gpuhealth breaker ack`) or the wave leaves the window", gpu.Index, gpu.UUID))
	}
	return ok
}
