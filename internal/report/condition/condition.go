// Package condition reports GPU health as one Node condition, following node-problem-detector's
// conventions (the condition names the problem; True means the problem is present):
//
//	type:    GPUUnhealthy
//	status:  True  - at least one GPU is Unhealthy (reason GPUsUnhealthy)
//	         False - no GPU is Unhealthy (reason GPUsDegraded when some are Degraded, else GPUsHealthy)
//	message: which GPUs, by index and UUID, and why
//
// The condition is written with a strategic merge patch of nodes/status that touches only this
// condition (the kubelet's conditions are left alone), and only when type, status, reason or
// message differ from what the Node has. lastTransitionTime changes only when status does.
//
// Events records a Node Event for every health transition of a GPU.
package condition

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Type is the condition's type.
const Type corev1.NodeConditionType = "GPUUnhealthy"

// The condition's reasons.
const (
	ReasonUnhealthy = "GPUsUnhealthy"
	ReasonDegraded  = "GPUsDegraded"
	ReasonHealthy   = "GPUsHealthy"
)

// Syncer keeps the GPUUnhealthy condition of one Node.
type Syncer struct {
	client   kubernetes.Interface
	nodeName string
	clock    clock.PassiveClock
}

var _ report.Syncer = (*Syncer)(nil)

// New returns a Syncer for nodeName.
func New(client kubernetes.Interface, nodeName string, clk clock.PassiveClock) *Syncer {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Syncer{client: client, nodeName: nodeName, clock: clk}
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "condition" }

// Desired returns the condition's status, reason and message for snap.
func Desired(snap health.Snapshot) (corev1.ConditionStatus, string, string) {
	var unhealthy, degraded []string
	total := 0
	for _, d := range snap.Devices {
		if d.Device.MIG != nil {
			continue
		}
		total++
		s := report.Summarize(d)
		desc := fmt.Sprintf("%d (%s): %s", d.Device.Index, d.Device.UUID, strings.Join(s.Reasons, ", "))
		switch d.Health {
		case health.Unhealthy:
			unhealthy = append(unhealthy, desc)
		case health.Degraded:
			degraded = append(degraded, desc)
		}
	}
	var parts []string
	if len(unhealthy) > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d GPUs unhealthy: %s", len(unhealthy), total, strings.Join(unhealthy, "; ")))
	}
	if len(degraded) > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d GPUs degraded: %s", len(degraded), total, strings.Join(degraded, "; ")))
	}
	switch {
	case len(unhealthy) > 0:
		return corev1.ConditionTrue, ReasonUnhealthy, strings.Join(parts, ". ")
	case len(degraded) > 0:
		return corev1.ConditionFalse, ReasonDegraded, strings.Join(parts, ". ")
	default:
		return corev1.ConditionFalse, ReasonHealthy, fmt.Sprintf("all %d GPUs are healthy", total)
	}
}

// Sync implements report.Syncer.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	status, reason, message := Desired(snap)
	node, err := s.client.CoreV1().Nodes().Get(ctx, s.nodeName, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("get node %s: %w", s.nodeName, err)
	}
	now := metav1.NewTime(s.clock.Now())
	transition := now
	for _, c := range node.Status.Conditions {
		if c.Type != Type {
			continue
		}
		if c.Status == status && c.Reason == reason && c.Message == message {
			return 0, nil
		}
		if c.Status == status {
			transition = c.LastTransitionTime
		}
	}
	cond := corev1.NodeCondition{
		Type: Type, Status: status, Reason: reason, Message: message,
		LastHeartbeatTime: now, LastTransitionTime: transition,
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return 0, err
	}
	if _, err := s.client.CoreV1().Nodes().PatchStatus(ctx, s.nodeName, body); err != nil {
		return 0, fmt.Errorf("patch node %s condition: %w", s.nodeName, err)
	}
	return 1, nil
}

// Events records a Node Event for each GPU health transition.
type Events struct {
	recorder record.EventRecorder
	node     *corev1.ObjectReference
}

// NewEvents returns an Events that records on nodeName through recorder.
func NewEvents(recorder record.EventRecorder, nodeName string, nodeUID types.UID) *Events {
	return &Events{recorder: recorder, node: &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: nodeName, UID: nodeUID}}
}

// Event reasons.
const (
	EventGPUUnhealthy = "GPUUnhealthy"
	EventGPUDegraded  = "GPUDegraded"
	EventGPURecovered = "GPURecovered"
)

// Record records one transition.
func (e *Events) Record(t health.Transition) {
	eventType, reason := corev1.EventTypeWarning, EventGPUUnhealthy
	switch {
	case t.To == health.Degraded && t.From < t.To:
		reason = EventGPUDegraded
	case t.To < t.From:
		eventType, reason = corev1.EventTypeNormal, EventGPURecovered
		if t.To == health.Degraded {
			reason = EventGPUDegraded
		}
	}
	what := fmt.Sprintf("GPU %d (%s)", t.Device.Index, t.Device.UUID)
	if t.Device.MIG != nil {
		what = fmt.Sprintf("MIG instance %s of GPU %d (GI %d, CI %d)", t.Device.UUID, t.Device.Index, t.Device.MIG.GPUInstance, t.Device.MIG.ComputeInstance)
	}
	e.recorder.Eventf(e.node, eventType, reason, "%s: %s -> %s: %s", what, t.From, t.To, t.Reason)
}
