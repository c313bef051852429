// Package nodecondition reports GPU health as one Node condition, following node-problem-detector's
// conventions (the condition names the problem; True means the problem is present):
//
//	type:    GPUUnhealthy
//	status:  True  - at least one GPU is Unhealthy (reason GPUsUnhealthy)
//	         False - no GPU is Unhealthy (reason GPUsDegraded when some are Degraded, else GPUsHealthy)
//	message: which GPUs, by index and UUID, and why
//
// The condition is written with a strategic merge patch of nodes/status that touches only this
// condition (the kubelet's conditions are left alone), and only when type, status, reason or
// message differ from what the Node has (read from the agent's shared cache, nodecache); the
// agent's heartbeat is a Lease (internal/heartbeat), so nothing is written while nothing
// changes. A change to the condition by someone else is repaired at once. lastTransitionTime
// changes only when status does.
//
// With the circuit breaker it adds GPUCircuitBreakerOpen, and one repair condition for node
// repair engines (repair.go): by default remediation's GPURebootRequired, or a configured type
// such as AcceleratedHardwareReady that asks for a reboot or a replacement within the breaker's
// budget (docs/repair-engines.md).
//
// Events records a Node Event for every health transition of a GPU.
package nodecondition

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// Type is the condition's type.
const Type = corev1.NodeConditionType(gpuhealthv1.ConditionGPUUnhealthy)

// The condition's reasons.
const (
	ReasonUnhealthy = gpuhealthv1.ReasonGPUsUnhealthy
	ReasonDegraded  = gpuhealthv1.ReasonGPUsDegraded
	ReasonHealthy   = gpuhealthv1.ReasonGPUsHealthy
)

// BreakerType is the condition saying the circuit breaker holds back this node's GPUs.
const BreakerType = corev1.NodeConditionType(gpuhealthv1.ConditionCircuitBreakerOpen)

// RebootType is the condition saying a GPU needs the node rebooted (see RebootDesired).
const RebootType = corev1.NodeConditionType(gpuhealthv1.ConditionGPURebootRequired)

// Options configure a Syncer. The zero value is ready to use.
type Options struct {
	// Nodes, when set, is the agent's shared cache of this Node; nil gives the syncer one of its
	// own.
	Nodes *nodecache.Cache
	// Clock stamps the conditions' heartbeat and transition times (default the real clock).
	Clock clock.PassiveClock
	// Breaker, when set, is the circuit breaker whose held-back GPUs the syncer reports in a
	// second condition, GPUCircuitBreakerOpen. The agent gives it the BreakerGate it shares with
	// the device-taint reporter, an Admitter the repair condition asks itself.
	Breaker Breaker
	// RebootRequired adds the GPURebootRequired condition (with remediation on) while Repair is
	// the default.
	RebootRequired bool
	// Repair is agent.repairCondition. Its default is GPURebootRequired, as RebootRequired says;
	// any other type is written always, in its place, and asks for no repair of a GPU the
	// Breaker does not admit (it asks a Breaker that is an Admitter itself).
	Repair config.RepairConditionConfig
}

// Breaker is what the syncer asks the circuit breaker (see internal/breaker): the GPUs of this
// node it holds back.
type Breaker interface {
	Held() []string
}

// DomainBreaker is a Breaker with budgets per domain (internal/breaker's): the domains
// (label=value) whose own budgets hold back GPUs of this node, which the condition names.
type DomainBreaker interface {
	HeldDomains() []string
}

// Syncer keeps the GPUUnhealthy condition of one Node.
type Syncer struct {
	client   kube.Interface
	nodeName string
	nodes    *nodecache.Cache
	clock    clock.PassiveClock
	breaker  Breaker // nil: no GPUCircuitBreakerOpen condition
	reboot   bool
	repair   config.RepairConditionConfig // with its defaults
	// admitted are the GPUs the breaker let ask for a repair, while they need one (repair.go).
	admitted map[string]bool

	// written is what the last patch wrote, so that the informer event of our own patch does
	// not cost another Sync.
	mu      sync.Mutex
	written []corev1.NodeCondition
}

var (
	_ report.Syncer  = (*Syncer)(nil)
	_ report.Starter = (*Syncer)(nil)
)

// New returns a Syncer for nodeName.
func New(client kube.Interface, nodeName string, opts Options) *Syncer {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Nodes == nil {
		opts.Nodes = nodecache.New(client, nodeName)
	}
	return &Syncer{client: client, nodeName: nodeName, nodes: opts.Nodes, clock: opts.Clock, breaker: opts.Breaker, reboot: opts.RebootRequired,
		repair: opts.Repair.WithDefaults(), admitted: map[string]bool{}}
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return "condition" }

// Start watches the Node so that a change to our conditions by someone else is repaired at once
// rather than at the next resync.
func (s *Syncer) Start(ctx context.Context, trigger func()) error {
	if err := s.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: report.OnNodeUpdate(trigger, func(o, n *corev1.Node) bool {
			return !sameConditions(s.ours(o), s.ours(n)) && !s.isOurs(n)
		}),
	}); err != nil {
		return err
	}
	return s.nodes.Start(ctx)
}

// ours returns the node's conditions of the types this syncer keeps.
func (s *Syncer) ours(n *corev1.Node) []corev1.NodeCondition {
	var out []corev1.NodeCondition
	for _, c := range n.Status.Conditions {
		if c.Type == Type || c.Type == BreakerType || c.Type == RebootType || string(c.Type) == s.repair.Type {
			out = append(out, c)
		}
	}
	return out
}

// sameConditions compares type, status, reason and message, in order.
func sameConditions(a, b []corev1.NodeCondition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Type != b[i].Type || a[i].Status != b[i].Status || a[i].Reason != b[i].Reason || a[i].Message != b[i].Message {
			return false
		}
	}
	return true
}

// isOurs reports whether the node's conditions are exactly what the last patch wrote.
func (s *Syncer) isOurs(n *corev1.Node) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written == nil {
		return false
	}
	have := s.ours(n)
	for _, w := range s.written {
		found := false
		for _, h := range have {
			if h.Type == w.Type {
				found = sameConditions([]corev1.NodeCondition{h}, []corev1.NodeCondition{w})
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Desired returns the condition's status, reason and message for snap.
func Desired(snap health.Snapshot) (corev1.ConditionStatus, string, string) {
	var unhealthy, degraded []string
	total := 0
	for _, d := range snap.Devices {
		if d.Device.MIG != nil {
			continue
		}
		total++
		s := gpuhealthv1.Summarize(d)
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
	// A node finding (an XID spread over several GPUs: likely software) makes no GPU less
	// healthy; it is said here, and is the reason when no GPU is degraded or worse.
	for _, f := range snap.Findings {
		parts = append(parts, fmt.Sprintf("node: %s: %s", f.Reason, f.Message))
	}
	switch {
	case len(unhealthy) > 0:
		return corev1.ConditionTrue, ReasonUnhealthy, strings.Join(parts, ". ")
	case len(degraded) > 0:
		return corev1.ConditionFalse, ReasonDegraded, strings.Join(parts, ". ")
	case len(snap.Findings) > 0:
		return corev1.ConditionFalse, snap.Findings[0].Reason, strings.Join(parts, ". ")
	default:
		return corev1.ConditionFalse, ReasonHealthy, fmt.Sprintf("all %d GPUs are healthy", total)
	}
}

// Sync implements report.Syncer.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	status, reason, message := Desired(snap)
	want := []corev1.NodeCondition{{Type: Type, Status: status, Reason: reason, Message: message}}
	if s.breaker != nil {
		var domains []string
		if d, ok := s.breaker.(DomainBreaker); ok {
			domains = d.HeldDomains()
		}
		want = append(want, breakerCondition(s.breaker.Held(), domains))
	}
	var breakerErr error // the repair condition is written, GPUs the breaker did not answer held
	switch {
	case !s.repair.IsDefault():
		var held []string
		held, breakerErr = s.repairHeld(ctx, snap)
		want = append(want, repairCondition(s.repair, RepairDesired(snap, held)))
	case s.reboot:
		status, reason, message := RebootDesired(snap)
		want = append(want, corev1.NodeCondition{Type: RebootType, Status: status, Reason: reason, Message: message})
	}
	node, err := s.nodes.Get(ctx)
	if err != nil {
		return 0, err
	}
	now := metav1.NewTime(s.clock.Now())
	changed := false
	for i := range want {
		w := &want[i]
		w.LastHeartbeatTime, w.LastTransitionTime = now, now
		found := false
		for _, c := range node.Status.Conditions {
			if c.Type != w.Type {
				continue
			}
			found = true
			if c.Status == w.Status {
				w.LastTransitionTime = c.LastTransitionTime
			}
			if c.Status != w.Status || c.Reason != w.Reason || c.Message != w.Message {
				changed = true
			}
		}
		changed = changed || !found
	}
	if !changed {
		return 0, breakerErr
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": want}})
	if err != nil {
		return 0, err
	}
	patched, err := s.client.CoreV1().Nodes().Patch(ctx, s.nodeName, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		return 0, fmt.Errorf("patch node %s condition: %w", s.nodeName, err)
	}
	s.nodes.Wrote(patched)
	s.mu.Lock()
	s.written = want
	s.mu.Unlock()
	return 1, breakerErr
}

// ReportUnknown sets the GPUUnhealthy condition of node to Unknown with reason
// NVMLUnavailable and message: the agent cannot see the GPUs (NVML is not available) and says
// so instead of leaving the last verdict, or none, to look current. The other conditions are left
// alone; lastTransitionTime is now only when the status was not Unknown already.
func ReportUnknown(ctx context.Context, client kube.Interface, node, message string, now time.Time) error {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", node, err)
	}
	want := corev1.NodeCondition{Type: Type, Status: corev1.ConditionUnknown, Reason: gpuhealthv1.ReasonNVMLUnavailable,
		Message: message, LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
	for _, c := range n.Status.Conditions {
		if c.Type != Type {
			continue
		}
		if c.Status == want.Status {
			if c.Reason == want.Reason && c.Message == want.Message {
				return nil
			}
			want.LastTransitionTime = c.LastTransitionTime
		}
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{want}}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("patch node %s condition: %w", node, err)
	}
	return nil
}

// RebootDesired returns the GPURebootRequired condition for snap: True with reason
// RemediationFailed when remediation gave up on a GPU (its condition has that reason, or
// ValidationFailed with a reboot recommended), else True
// with reason RebootRecommended when an Unhealthy condition of a GPU recommends a reboot, else
// False.
func RebootDesired(snap health.Snapshot) (corev1.ConditionStatus, string, string) {
	var failed, recommended []string
	for _, d := range snap.Devices {
		if d.Device.MIG != nil {
			continue
		}
		for _, c := range d.Conditions {
			desc := fmt.Sprintf("%d (%s): %s", d.Device.Index, d.Device.UUID, c.Message)
			switch {
			case c.Reason == gpuhealthv1.ReasonRemediationFailed,
				c.Reason == gpuhealthv1.ReasonValidationFailed && c.RecommendedAction == health.ActionRebootNode:
				failed = append(failed, desc)
			case c.Severity == health.Unhealthy && c.RecommendedAction == health.ActionRebootNode:
				recommended = append(recommended, desc)
			}
		}
	}
	switch {
	case len(failed) > 0:
		return corev1.ConditionTrue, gpuhealthv1.ReasonRemediationFailed,
			"GPU resets did not repair GPU " + strings.Join(failed, "; GPU ") + "; reboot or power-cycle the node"
	case len(recommended) > 0:
		return corev1.ConditionTrue, gpuhealthv1.ReasonRebootRecommended, "a reboot is recommended for GPU " + strings.Join(recommended, "; GPU ")
	default:
		return corev1.ConditionFalse, gpuhealthv1.ReasonNoRebootRequired, "no GPU needs a node reboot"
	}
}

func breakerCondition(held, domains []string) corev1.NodeCondition {
	if len(held) == 0 {
		return corev1.NodeCondition{Type: BreakerType, Status: corev1.ConditionFalse, Reason: "CircuitBreakerClosed",
			Message: "no GPU of this node is held back"}
	}
	if len(domains) > 0 {
		return corev1.NodeCondition{Type: BreakerType, Status: corev1.ConditionTrue, Reason: "CircuitBreakerOpen",
			Message: fmt.Sprintf("%d GPUs of this node are tainted None instead of NoSchedule/NoExecute because too many GPUs of its domain %s failed at once (%s); the rest of the cluster is admitted; `gpuhealth breaker ack` lets them through",
				len(held), strings.Join(domains, ", "), strings.Join(held, ", "))}
	}
	return corev1.NodeCondition{Type: BreakerType, Status: corev1.ConditionTrue, Reason: "CircuitBreakerOpen",
		Message: fmt.Sprintf("%d GPUs of this node are tainted None instead of NoSchedule/NoExecute because too many of the cluster's GPUs failed at once (%s); `gpuhealth breaker ack` lets them through",
			len(held), strings.Join(held, ", "))}
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
	if t.Message == "" {
		e.recorder.Eventf(e.node, eventType, reason, "%s: %s -> %s: %s", what, t.From, t.To, t.Reason)
		return
	}
	e.recorder.Eventf(e.node, eventType, reason, "%s: %s -> %s: %s (%s)", what, t.From, t.To, t.Reason, t.Message)
}
