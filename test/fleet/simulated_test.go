//go:build e2e

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// Simulated nodes. A real agent costs about 1 MiB in this process, so at 50,000 nodes only
// GPUHEALTH_FLEET_AGENTS nodes run one; the other nodes are written as an agent writes them,
// copied from what the real agents wrote:
//
//   - at start-up, each is created with the annotations and conditions a real agent wrote on its
//     Node at start-up (copyWrites: the same values, the template node's name and GPU identities
//     replaced by the node's own);
//   - its heartbeat Lease is created as heartbeat.Renewer creates it and renewed every
//     agent.heartbeat (plus the Renewer's jitter) with the Renewer's one write, an update of the
//     Lease the last write returned, over a few shared clients (simClients);
//   - in the wave, its failing GPU gets what a real agent wrote for a fault on the GPU of the
//     same index (a single fault of singleFaults, copied the same way), in the agents' order.

// simClients is how many clients carry the simulated nodes' writes, and simSenders how many
// simulated nodes send their wave's writes at once (in the bare wave too): tens of thousands of
// nodes' requests at once over a few connections lost them to HTTP/2 health checks on 2 busy
// cores, while the API server takes no more than a few hundred at a time anyway.
const (
	simClients = 32
	simSenders = 4096
)

// agentWrites is what one real agent wrote on its Node (the annotations and conditions it
// owns) and, for a fault, its DeviceTaintRules: a template for the simulated nodes.
type agentWrites struct {
	node        string
	uuids       []string
	annotations map[string]string
	conditions  []corev1.NodeCondition
	rules       []*resourcev1.DeviceTaintRule
}

// copyFor returns w as node n's agent would have written it: every occurrence of w's node name and
// GPU identities (as written, lowercase, uppercase, as a label value) replaced by n's. It fails
// when anything of w's node is left.
func (w *agentWrites) copyFor(n *fleetNode) (*agentWrites, error) {
	var pairs []string
	for j, u := range w.uuids {
		for _, f := range []func(string) string{strings.ToLower, strings.ToUpper, dra.LabelValue} {
			pairs = append(pairs, f(u), f(n.uuids[j]))
		}
		pairs = append(pairs, u, n.uuids[j])
	}
	pairs = append(pairs, w.node, n.name)
	r := strings.NewReplacer(pairs...)
	raw, err := json.Marshal(struct {
		A map[string]string
		C []corev1.NodeCondition
		R []*resourcev1.DeviceTaintRule
	}{w.annotations, w.conditions, w.rules})
	if err != nil {
		return nil, err
	}
	out := r.Replace(string(raw))
	lower := strings.ToLower(out)
	for _, u := range w.uuids {
		if core := strings.ToLower(strings.TrimPrefix(u, "GPU-")); strings.Contains(lower, core) {
			return nil, fmt.Errorf("copying %s's writes for %s: %s is left in %s", w.node, n.name, u, out)
		}
	}
	var c struct {
		A map[string]string
		C []corev1.NodeCondition
		R []*resourcev1.DeviceTaintRule
	}
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		return nil, err
	}
	for _, rule := range c.R {
		rule.ResourceVersion, rule.UID, rule.CreationTimestamp, rule.ManagedFields, rule.Generation = "", "", metav1.Time{}, nil, 0
	}
	return &agentWrites{node: n.name, uuids: n.uuids, annotations: c.A, conditions: c.C, rules: c.R}, nil
}

// startupWrites reads what n's (real) agent wrote on its Node at start-up: every annotation and
// condition the test did not create the Node with.
func startupWrites(ctx context.Context, admin kubernetes.Interface, n *fleetNode) (*agentWrites, error) {
	node, err := admin.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	created := controlplane.Node(n.name)
	w := &agentWrites{node: n.name, uuids: n.uuids, annotations: map[string]string{}}
	for k, v := range node.Annotations {
		if _, ok := created.Annotations[k]; !ok {
			w.annotations[k] = v
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady {
			w.conditions = append(w.conditions, c)
		}
	}
	if len(w.annotations) == 0 || w.annotations[gpuhealthv1.HealthKey] == "" {
		return nil, fmt.Errorf("node %s: the agent wrote no %s at start-up: %v", n.name, gpuhealthv1.HealthKey, node.Annotations)
	}
	return w, nil
}

// faultWrites reads what n's (real) agent wrote for its fault on GPU gpu: the annotations the
// bare wave copies, the GPUUnhealthy condition, and the GPU's DeviceTaintRule.
func faultWrites(ctx context.Context, admin kubernetes.Interface, n *fleetNode, gpu int) (*agentWrites, error) {
	node, err := admin.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	w := &agentWrites{node: n.name, uuids: n.uuids, annotations: map[string]string{}}
	for _, key := range []string{gpuhealthv1.UnhealthyIDsKey, gpuhealthv1.HealthKey, gpuhealthv1.VolcanoStateKey} {
		w.annotations[key] = node.Annotations[key]
	}
	for _, c := range node.Status.Conditions {
		if c.Type == gpuhealthv1.ConditionGPUUnhealthy {
			w.conditions = append(w.conditions, c)
		}
	}
	rule, err := admin.ResourceV1().DeviceTaintRules().Get(ctx, devicetaint.RuleName(n.name, n.uuids[gpu]), metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	w.rules = []*resourcev1.DeviceTaintRule{{ObjectMeta: metav1.ObjectMeta{Name: rule.Name, Labels: rule.Labels, Annotations: rule.Annotations}, Spec: rule.Spec}}
	return w, nil
}

// simFleet carries the simulated nodes' writes: a few clients with the agents' identity, shared.
type simFleet struct {
	clients []kubernetes.Interface
	period  time.Duration
	renewed sync.WaitGroup
}

// newSimFleet makes the shared clients (the agents' ServiceAccount, so the agents' FlowSchema; no
// client-side rate limit, since each stands for thousands of agents, each far below its own).
func newSimFleet(t *testing.T, agentCfg *rest.Config, counter *requestCounter, period time.Duration) *simFleet {
	t.Helper()
	s := &simFleet{period: period}
	for range simClients {
		cfg := rest.CopyConfig(agentCfg)
		cfg.QPS, cfg.Burst = -1, 0
		cfg.Timeout = time.Minute                                             // a request lost with its connection fails, and is sent again
		cfg.ContentType = "application/vnd.kubernetes.protobuf"               // as the agents' own client
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil } // a connection of its own
		cfg.WrapTransport = counter.wrap
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.clients = append(s.clients, c)
	}
	return s
}

func (s *simFleet) client(i int) kubernetes.Interface { return s.clients[i%len(s.clients)] }

// createSimulated creates the simulated nodes (sim: their indexes into fleet) as their agents
// would have left them at start-up (start, copied for each), their ResourceSlices, and their
// heartbeat Leases as heartbeat.Renewer creates them.
func createSimulated(ctx context.Context, admin kubernetes.Interface, fleet []*fleetNode, sim []int, start *agentWrites, period time.Duration) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for _, i := range sim {
		n := fleet[i]
		g.Go(func() error {
			w, err := start.copyFor(n)
			if err != nil {
				return err
			}
			node := fleetNodeObject(n.name)
			maps.Copy(node.Labels, n.labels)
			node.Annotations = w.annotations
			node.Status.Conditions = append(node.Status.Conditions, w.conditions...)
			if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create node %s: %w", n.name, err)
			}
			if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(n.name, n.uuids...), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create ResourceSlice of %s: %w", n.name, err)
			}
			now := metav1.MicroTime{Time: time.Now()}
			lease := &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: gpuhealthv1.HeartbeatLeaseName(n.name), Namespace: agentNamespace, Labels: map[string]string{gpuhealthv1.HeartbeatLeaseLabel: "true"}},
				Spec:       leaseSpec(n.name, period, now),
			}
			lease.Spec.AcquireTime = &now
			created, err := admin.CoordinationV1().Leases(agentNamespace).Create(ctx, lease, metav1.CreateOptions{FieldManager: "gpuhealth-agent"})
			if err != nil {
				return fmt.Errorf("create Lease of %s: %w", n.name, err)
			}
			n.lease = created
			return nil
		})
	}
	return g.Wait()
}

// leaseSpec is the spec heartbeat.Renewer writes for node at now.
func leaseSpec(node string, period time.Duration, now metav1.MicroTime) coordinationv1.LeaseSpec {
	return coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(node),
		LeaseDurationSeconds: ptr.To(int32(gpuhealthv1.StaleAfterPeriods * period / time.Second)),
		RenewTime:            &now,
	}
}

// renewLeases renews every simulated node's Lease until ctx is done: each at a random phase of
// the first period (as nodes that started at unrelated times), then every period plus the
// Renewer's jitter (up to a quarter more), with the Renewer's write: an update of the Lease the
// last write returned, read again only when it conflicts or is gone.
func (s *simFleet) renewLeases(ctx context.Context, fleet []*fleetNode, sim []int) {
	for k, i := range sim {
		n, client := fleet[i], s.client(k)
		s.renewed.Go(func() {
			delay := time.Duration(rand.Int64N(int64(s.period)))
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(delay):
				}
				if err := renewLease(ctx, client, n, s.period); err != nil && ctx.Err() == nil {
					delay = time.Second // as the Renewer retries soon
					continue
				}
				delay = wait.Jitter(s.period, 0.25)
			}
		})
	}
}

// renewLease is heartbeat.Renewer's renewal (renew) of n's Lease at now.
func renewLease(ctx context.Context, client kubernetes.Interface, n *fleetNode, period time.Duration) error {
	leases := client.CoordinationV1().Leases(agentNamespace)
	if n.lease == nil {
		got, err := leases.Get(ctx, gpuhealthv1.HeartbeatLeaseName(n.name), metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.lease = got
	}
	next := n.lease.DeepCopy()
	spec := leaseSpec(n.name, period, metav1.MicroTime{Time: time.Now()})
	spec.AcquireTime = n.lease.Spec.AcquireTime
	next.Spec = spec
	updated, err := leases.Update(ctx, next, metav1.UpdateOptions{FieldManager: "gpuhealth-agent"})
	if err != nil {
		n.lease = nil
		if apierrors.IsConflict(err) {
			return renewLease(ctx, client, n, period)
		}
		return err
	}
	n.lease = updated
	return nil
}

// simWrite is one simulated node's writes for its failing GPU in the wave, prepared before the
// wave: what the agent of the template node wrote for a fault on the GPU of the same index.
type simWrite struct {
	node       string
	annotation []byte
	status     []byte
	rules      []*resourcev1.DeviceTaintRule
	event      *corev1.Event
	client     kubernetes.Interface
	shared     bool // client is one of a simFleet's
}

// prepareSimWave builds the wave's writes of every failing simulated node from templates (by the
// failing GPU's index).
func prepareSimWave(s *simFleet, failing map[*fleetNode][]int, templates map[int]*agentWrites) ([]*simWrite, error) {
	var out []*simWrite
	k := 0
	for n, gpus := range failing {
		if !n.simulated {
			continue
		}
		if len(gpus) != 1 {
			return nil, fmt.Errorf("node %s: %d failing GPUs in the wave, want one", n.name, len(gpus))
		}
		tmpl, ok := templates[gpus[0]]
		if !ok {
			return nil, fmt.Errorf("no real agent's fault on GPU %d to copy for %s (GPUHEALTH_FLEET_FAULTS too small?)", gpus[0], n.name)
		}
		w, err := tmpl.copyFor(n)
		if err != nil {
			return nil, err
		}
		sw := &simWrite{node: n.name, rules: w.rules, client: s.client(k), shared: true}
		k++
		if sw.annotation, err = json.Marshal(map[string]any{"metadata": map[string]any{"annotations": w.annotations}}); err != nil {
			return nil, err
		}
		if len(w.conditions) != 1 {
			return nil, fmt.Errorf("template %s: %d GPUUnhealthy conditions", tmpl.node, len(w.conditions))
		}
		cond := w.conditions[0]
		cond.LastTransitionTime, cond.LastHeartbeatTime = metav1.Now(), metav1.Now()
		if sw.status, err = json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}}); err != nil {
			return nil, err
		}
		sw.event = waveEvent(n.name, "gpuhealth-agent", cond.Reason, cond.Message)
		out = append(out, sw)
	}
	return out, nil
}

// waveEvent is the Event an agent records for its node's condition change.
func waveEvent(node, component, reason, message string) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: node + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node},
		Reason:         reason, Message: message, Type: corev1.EventTypeWarning, Count: 1,
		Source:         corev1.EventSource{Component: component, Host: node},
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(),
	}
}

// send sends w's writes in the agents' order: the annotation patch and the rules together, then
// the condition and the Event. A request the API server could not serve in time (an overloaded
// server times out or sheds requests client-go does not retry) is sent again, as an agent's
// writers retry; a create that turns out to have been done counts as done.
func (w *simWrite) send(ctx context.Context, manager string) error {
	var first errgroup.Group
	first.Go(func() error {
		return retryTransient(ctx, func() error {
			_, err := w.client.CoreV1().Nodes().Patch(ctx, w.node, types.MergePatchType, w.annotation, metav1.PatchOptions{FieldManager: manager})
			return err
		})
	})
	for _, r := range w.rules {
		first.Go(func() error {
			return retryTransient(ctx, func() error {
				_, err := w.client.ResourceV1().DeviceTaintRules().Create(ctx, r, metav1.CreateOptions{FieldManager: manager})
				if apierrors.IsAlreadyExists(err) {
					return nil
				}
				return err
			})
		})
	}
	if err := first.Wait(); err != nil {
		return fmt.Errorf("%s: %w", w.node, err)
	}
	var then errgroup.Group
	then.Go(func() error {
		return retryTransient(ctx, func() error {
			_, err := w.client.CoreV1().Nodes().Patch(ctx, w.node, types.StrategicMergePatchType, w.status, metav1.PatchOptions{FieldManager: manager}, "status")
			return err
		})
	})
	then.Go(func() error {
		return retryTransient(ctx, func() error {
			_, err := w.client.CoreV1().Events(w.event.Namespace).Create(ctx, w.event, metav1.CreateOptions{})
			return err
		})
	})
	if err := then.Wait(); err != nil {
		return fmt.Errorf("%s: %w", w.node, err)
	}
	return nil
}

// retryTransient calls f until it succeeds or fails for good (a request the API server refused:
// invalid, forbidden, not found), at most 10 times, waiting a little longer each time: an
// overloaded server's 429s, timeouts and 5xx, and connections lost under load, are sent again.
func retryTransient(ctx context.Context, f func() error) error {
	delay := 100 * time.Millisecond
	for try := 1; ; try++ {
		err := f()
		permanent := apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || apierrors.IsForbidden(err) ||
			apierrors.IsUnauthorized(err) || apierrors.IsNotFound(err) || apierrors.IsConflict(err)
		if err == nil || permanent || try == 10 || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}
