// Package silence marks the Nodes whose gpuhealth agent went silent. An agent's last report
// stays on its Node after the agent stops (crash loop, evicted DaemonSet pod, a node cut off from
// the API server): every path that reads only the report (Volcano's gpu-unhealthy-ids, the
// DeviceTaintRules, ResourceClaim status, the device plugin) would keep taking a dead agent's
// "healthy" as current. The Watcher, run once for the cluster by the breaker controller, judges
// every agent's heartbeat and makes the silence visible where everyone looks: the Node's
// GPUUnhealthy condition becomes Unknown with reason AgentSilent, an Event says so (and another
// when the agent is back), a metric counts the silent nodes, and, when configured, a NoSchedule
// taint (gpuhealthv1.AgentSilentTaintKey) keeps new pods off the node until the agent writes again.
//
// The heartbeat is the agent's Lease (gpuhealthv1.HeartbeatLeaseName in Options.Namespace), or
// for an agent of an earlier release the Node's heartbeat annotation. A node is silent when its
// heartbeat is older than StaleAfter, unreadable, or further than StaleAfter in the future, and
// when it had a heartbeat and it is gone (deleting the Lease or the annotation must not make a
// dead agent "never stale"). A node with a gpu-health report and no
// heartbeat ever seen has an agent that predates heartbeats and is judged as before (not at all);
// a node with neither has no agent and is left alone. The agent's own next write replaces the
// condition; the Watcher only removes its taint.
package silence

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/heartbeat"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// conditionType is the agents' node condition, which the Watcher sets to Unknown.
const conditionType = corev1.NodeConditionType(gpuhealthv1.ConditionGPUUnhealthy)

// Options configure a Watcher. Client and a positive StaleAfter are required.
type Options struct {
	Client kube.Interface
	// Namespace holds the agents' heartbeat Leases (the chart's namespace); empty judges only
	// the heartbeat annotation of agents of earlier releases.
	Namespace string
	// StaleAfter is how old a heartbeat may be (gpuhealthv1.DefaultStaleAfter: three periods).
	StaleAfter time.Duration
	// Taint puts gpuhealthv1.AgentSilentTaintKey (NoSchedule) on a silent node.
	Taint bool
	// Recorder posts the Events (nil: none).
	Recorder record.EventRecorder
	Clock    clock.Clock
	// Silent, when set, is called with the number of silent nodes after every change of it;
	// Marked with each node that goes silent.
	Silent func(nodes int)
	Marked func()
}

// Watcher marks silent agents' Nodes until its Run ends.
type Watcher struct {
	opts   Options
	leases *heartbeat.Leases // nil without Options.Namespace
	// hadBeat are the nodes seen with a heartbeat since Run began; silent those judged silent.
	hadBeat, silent map[string]bool
	// marked is when the Watcher last wrote a node's condition: it writes it again only once a
	// StaleAfter has passed, when something else (the agent) rewrote it meanwhile.
	marked map[string]time.Time
}

// New returns a Watcher of opts.
func New(opts Options) (*Watcher, error) {
	if opts.Client == nil || opts.StaleAfter <= 0 {
		return nil, fmt.Errorf("agent silence watcher: a client and a positive staleness bound are required (got %v)", opts.StaleAfter)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Watcher{opts: opts, hadBeat: map[string]bool{}, silent: map[string]bool{}, marked: map[string]time.Time{}}, nil
}

// Run watches the Nodes and marks the silent ones until ctx is done.
func (w *Watcher) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("controller", "agent-silence")
	ctx = klog.NewContext(ctx, logger)
	var informers kube.Informers
	nodes := informers.Add(kube.NewInformer(w.opts.Client, w.opts.Client.CoreV1().Nodes(), &corev1.Node{}, nil))
	if err := nodes.SetTransform(func(obj any) (any, error) { return judgedNode(obj), nil }); err != nil {
		return err
	}
	var leaseInf cache.SharedIndexInformer
	if w.opts.Namespace != "" {
		w.leases = heartbeat.NewLeases(w.opts.Client, w.opts.Namespace)
		leaseInf = informers.Add(w.leases.Informer())
	}
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "agent-silence"})
	defer queue.ShutDown()
	if _, err := nodes.AddEventHandler(kube.Handlers(func(n *corev1.Node) { queue.Add(n.Name) }, func(n *corev1.Node) { queue.Add(n.Name) })); err != nil {
		return err
	}
	if leaseInf != nil {
		onLease := func(l *coordinationv1.Lease) {
			if l.Spec.HolderIdentity != nil {
				queue.Add(*l.Spec.HolderIdentity)
			}
		}
		if _, err := leaseInf.AddEventHandler(kube.Handlers(onLease, onLease)); err != nil {
			return err
		}
	}
	return kube.Work(ctx, "agent silence watcher", &informers, queue, func(name string) {
		recheck, err := w.reconcile(ctx, nodes.GetStore(), name)
		if err != nil {
			logger.Error(err, "Marking a node's agent silence failed; retrying", "node", name)
			queue.AddRateLimited(name)
			return
		}
		queue.Forget(name)
		if recheck > 0 {
			// Silence comes by itself, with no event to announce it: look again when the
			// heartbeat would go stale.
			queue.AddAfter(name, recheck)
		}
	})
}

// verdict is what a Node's heartbeat says at some time.
type verdict struct {
	judged bool   // the node has an agent whose silence can be told
	silent bool   // and it is silent
	why    string // for the condition's message, stable while the silence lasts
	// recheck is when a fresh heartbeat would go stale (0: nothing to wait for).
	recheck time.Duration
}

// judge judges node n at now.
func (w *Watcher) judge(n *corev1.Node, now time.Time) verdict {
	lease := w.leases.Of(n.Name)
	_, hasBeat := n.Annotations[gpuhealthv1.HeartbeatKey]
	_, hasReport := n.Annotations[gpuhealthv1.HealthKey]
	switch {
	case lease != nil || hasBeat:
		w.hadBeat[n.Name] = true
		s := heartbeat.Judge(n.Name, n.Annotations, lease, now, w.opts.StaleAfter)
		switch {
		case s.Err != nil:
			return verdict{judged: true, silent: true, why: "its heartbeat cannot be read (" + s.Err.Error() + ")"}
		case s.Future:
			return verdict{judged: true, silent: true, why: fmt.Sprintf("its heartbeat is in the future (%s)", s.Heartbeat.UTC().Format(time.RFC3339))}
		case s.Stale:
			return verdict{judged: true, silent: true, why: fmt.Sprintf("its last heartbeat was at %s (stale after %v)", s.Heartbeat.UTC().Format(time.RFC3339), w.opts.StaleAfter)}
		}
		return verdict{judged: true, recheck: max(s.Heartbeat.Add(w.opts.StaleAfter).Sub(now), 0) + time.Second}
	case w.hadBeat[n.Name] || markedSilent(n):
		return verdict{judged: true, silent: true, why: "its heartbeat (Lease " + gpuhealthv1.HeartbeatLeaseName(n.Name) + ", or annotation " + gpuhealthv1.HeartbeatKey + ") was removed"}
	case hasReport:
		return verdict{} // an agent older than heartbeats: nothing to judge by
	}
	return verdict{} // no agent
}

// reconcile brings node name's condition, taint and Events in line with its heartbeat, and
// returns when to look again.
func (w *Watcher) reconcile(ctx context.Context, store cache.Store, name string) (time.Duration, error) {
	obj, exists, err := store.GetByKey(name)
	if err != nil {
		return 0, err
	}
	if !exists {
		delete(w.hadBeat, name)
		delete(w.marked, name)
		w.setSilent(name, false)
		return 0, nil
	}
	n := obj.(*corev1.Node)
	now := w.opts.Clock.Now()
	v := w.judge(n, now)
	ref := &corev1.ObjectReference{Kind: "Node", Name: n.Name, UID: n.UID}
	logger := klog.FromContext(ctx).WithValues("node", n.Name)
	if !v.silent {
		if hasTaint(n) {
			if err := w.patchTaint(ctx, n, false); err != nil {
				return 0, err
			}
		}
		if w.silent[name] && v.judged {
			logger.Info("The node's agent writes its heartbeat again")
			w.event(ref, corev1.EventTypeNormal, gpuhealthv1.EventAgentBack, "the gpuhealth agent of node %s writes its heartbeat again", n.Name)
		}
		w.setSilent(name, false)
		delete(w.marked, name)
		return v.recheck, nil
	}
	message := fmt.Sprintf("the gpuhealth agent of this node is silent: %s; what it last reported about the GPUs cannot be trusted", v.why)
	// An agent that is alive but cannot renew its heartbeat (its Lease RBAC missing, its
	// namespace gone) repairs its condition at once: mark it again at most once per StaleAfter,
	// so that the two never write the Node in turn without end.
	if last, ok := w.marked[name]; !ok || now.Sub(last) >= w.opts.StaleAfter || markedSilent(n) {
		if err := w.setCondition(ctx, n, message, now); err != nil {
			return 0, err
		}
		if !markedSilent(n) {
			w.marked[name] = now
		}
	}
	if w.opts.Taint && !hasTaint(n) {
		if err := w.patchTaint(ctx, n, true); err != nil {
			return 0, err
		}
	}
	if !w.silent[name] {
		logger.Info("The node's agent went silent", "why", v.why)
		w.event(ref, corev1.EventTypeWarning, gpuhealthv1.EventAgentSilent, "the gpuhealth agent of node %s is silent: %s", n.Name, v.why)
		if w.opts.Marked != nil {
			w.opts.Marked()
		}
	}
	w.setSilent(name, true)
	return 0, nil
}

func (w *Watcher) event(ref *corev1.ObjectReference, eventType, reason, format string, args ...any) {
	if w.opts.Recorder != nil {
		w.opts.Recorder.Eventf(ref, eventType, reason, format, args...)
	}
}

func (w *Watcher) setSilent(name string, silent bool) {
	if w.silent[name] == silent {
		return
	}
	if silent {
		w.silent[name] = true
	} else {
		delete(w.silent, name)
	}
	if w.opts.Silent != nil {
		w.opts.Silent(len(w.silent))
	}
}

// setCondition makes the node's GPUUnhealthy condition Unknown with reason AgentSilent and
// message, unless it says so already.
func (w *Watcher) setCondition(ctx context.Context, n *corev1.Node, message string, now time.Time) error {
	want := corev1.NodeCondition{Type: conditionType, Status: corev1.ConditionUnknown, Reason: gpuhealthv1.ReasonAgentSilent,
		Message: message, LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
	for _, c := range n.Status.Conditions {
		if c.Type != conditionType {
			continue
		}
		if c.Status == want.Status && c.Reason == want.Reason && c.Message == want.Message {
			return nil
		}
		if c.Status == want.Status {
			want.LastTransitionTime = c.LastTransitionTime
		}
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{want}}})
	if err != nil {
		return err
	}
	if _, err := w.opts.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, body, metav1.PatchOptions{FieldManager: "gpuhealth-breaker-controller"}, "status"); err != nil {
		return fmt.Errorf("mark node %s silent: %w", n.Name, err)
	}
	return nil
}

// patchTaint adds or removes the agent-silent taint: an update of the Node it reads, so that a
// taint someone else changed meanwhile is never lost (a conflict is retried by the queue).
func (w *Watcher) patchTaint(ctx context.Context, n *corev1.Node, add bool) error {
	full, err := w.opts.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", n.Name, err)
	}
	full.Spec.Taints = slices.DeleteFunc(full.Spec.Taints, isOurTaint)
	if add {
		full.Spec.Taints = append(full.Spec.Taints, corev1.Taint{Key: gpuhealthv1.AgentSilentTaintKey, Effect: corev1.TaintEffectNoSchedule, TimeAdded: ptrTime(metav1.Now())})
	}
	if _, err := w.opts.Client.CoreV1().Nodes().Update(ctx, full, metav1.UpdateOptions{FieldManager: "gpuhealth-breaker-controller"}); err != nil {
		return fmt.Errorf("taint node %s (add %v): %w", n.Name, add, err)
	}
	return nil
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }

func isOurTaint(t corev1.Taint) bool { return t.Key == gpuhealthv1.AgentSilentTaintKey }

func hasTaint(n *corev1.Node) bool { return slices.ContainsFunc(n.Spec.Taints, isOurTaint) }

// markedSilent reports whether the node's condition says the Watcher marked it (a controller
// that restarted remembers nothing else of a heartbeat that was removed).
func markedSilent(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
		return c.Type == conditionType && c.Reason == gpuhealthv1.ReasonAgentSilent
	})
}

// judgedNode is a Node reduced to what the Watcher reads: its name and UID, the heartbeat and
// (the presence of) the gpu-health report, its agent-silent taint and GPUUnhealthy condition.
func judgedNode(obj any) any {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj // a tombstone
	}
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}
	if v, ok := n.Annotations[gpuhealthv1.HeartbeatKey]; ok {
		out.Annotations = map[string]string{gpuhealthv1.HeartbeatKey: v}
	}
	if _, ok := n.Annotations[gpuhealthv1.HealthKey]; ok {
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[gpuhealthv1.HealthKey] = "" // only its presence is read
	}
	for _, t := range n.Spec.Taints {
		if isOurTaint(t) {
			out.Spec.Taints = append(out.Spec.Taints, t)
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == conditionType {
			out.Status.Conditions = append(out.Status.Conditions, c)
		}
	}
	return out
}
