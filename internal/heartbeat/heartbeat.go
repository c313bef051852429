// Package heartbeat carries the agents' heartbeats on Leases (coordination.k8s.io/v1), as the
// kubelet's node Leases do (KEP-589), instead of on the Node: a Node write is sent to every Node
// watcher in the cluster (schedulers, controllers, the extender, every agent's peer lookups), and
// a heartbeat written there every period by every agent is Node churn that carries no news. A
// Lease write reaches only the Lease's watchers: the readers that judge silence.
//
// Renewer is the agent's side: it renews its node's Lease (gpuhealthv1.HeartbeatLeaseName) every
// period, creating it when missing. Leases is the readers' side (the extender, the breaker
// controller, the silence watcher): an informer of the heartbeat Leases of one namespace, looked
// up by node.
package heartbeat

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// retryFirst and retryMax bound the wait after a renewal that failed: soon, so that a moment's
// API server outage does not cost a period, and never more often than a second.
const (
	retryFirst = time.Second
	retryMax   = time.Minute
)

// Renewer renews one node's heartbeat Lease.
type Renewer struct {
	Client    kube.Interface
	Namespace string
	Node      string
	// Period is how often it renews (agent.heartbeat); the Lease's leaseDurationSeconds says
	// StaleAfter, how long readers wait before they judge the agent silent.
	Period, StaleAfter time.Duration
	Clock              clock.WithTicker
	// Renewed, when set, is called after each renewal that succeeded (for metrics and readiness).
	Renewed func(at time.Time)
	// Jitter makes each wait (default: up to a quarter of a period more, at random), so that
	// agents whose renewals fell together (a restart of them all, an API server outage) do not
	// write in step again.
	Jitter func(time.Duration) time.Duration

	last *coordinationv1.Lease // the Lease the last write returned (nil: read it first)
}

// Run renews the Lease at once and then every Period until ctx is done. Failures are logged
// (the first, then once a minute of failing) and retried sooner, up to a Period.
func (r *Renewer) Run(ctx context.Context) error {
	if r.Client == nil || r.Namespace == "" || r.Node == "" || r.Period <= 0 {
		return fmt.Errorf("heartbeat: a client, a namespace, a node and a positive period are required")
	}
	clk := r.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	logger := klog.FromContext(ctx).WithValues("lease", klog.KRef(r.Namespace, gpuhealthv1.HeartbeatLeaseName(r.Node)))
	var failingSince, lastSaid time.Time
	var delay, failDelay time.Duration // until the next renewal, and after a failure
	jitter := r.Jitter
	if jitter == nil {
		jitter = func(d time.Duration) time.Duration { return wait.Jitter(d, 0.25) }
	}
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return nil
			case <-clk.After(delay):
			}
		}
		now := clk.Now()
		err := r.renew(ctx, now)
		switch {
		case err == nil:
			if !failingSince.IsZero() {
				logger.Info("Heartbeat renewed again", "failingFor", now.Sub(failingSince).Truncate(time.Second))
			}
			failingSince, failDelay = time.Time{}, 0
			delay = jitter(r.Period)
			if r.Renewed != nil {
				r.Renewed(now)
			}
		case ctx.Err() != nil:
			return nil
		default:
			if failingSince.IsZero() {
				failingSince = now
			}
			if now.Sub(lastSaid) >= time.Minute {
				logger.Error(err, "Renewing the heartbeat Lease failed; trying again", "failingFor", now.Sub(failingSince).Truncate(time.Second))
				lastSaid = now
			}
			failDelay = min(max(2*failDelay, retryFirst), retryMax, r.Period)
			delay = failDelay
		}
	}
}

// renew writes now as the Lease's renewTime, creating the Lease when it is missing. As the
// kubelet's node-lease controller does, it updates the Lease its last write returned, so that a
// renewal is one request; it reads the Lease again only when that write conflicts (someone else
// changed it) or finds it gone.
func (r *Renewer) renew(ctx context.Context, now time.Time) error {
	leases := r.Client.CoordinationV1().Leases(r.Namespace)
	name := gpuhealthv1.HeartbeatLeaseName(r.Node)
	spec := coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(r.Node),
		LeaseDurationSeconds: ptr.To(int32(max(r.StaleAfter, r.Period) / time.Second)),
		RenewTime:            &metav1.MicroTime{Time: now},
	}
	lease := r.last
	if lease == nil {
		got, err := leases.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			spec.AcquireTime = spec.RenewTime
			created, err := leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Namespace, Labels: map[string]string{gpuhealthv1.HeartbeatLeaseLabel: "true"}},
				Spec:       spec,
			}, metav1.CreateOptions{FieldManager: "gpuhealth-agent"})
			r.last = created
			return err
		case err != nil:
			return err
		}
		lease = got
	}
	next := lease.DeepCopy()
	spec.AcquireTime = lease.Spec.AcquireTime
	next.Spec = spec
	if next.Labels[gpuhealthv1.HeartbeatLeaseLabel] != "true" {
		next.Labels = map[string]string{gpuhealthv1.HeartbeatLeaseLabel: "true"}
	}
	updated, err := leases.Update(ctx, next, metav1.UpdateOptions{FieldManager: "gpuhealth-agent"})
	if err != nil {
		cached := r.last != nil
		r.last = nil
		if cached && (apierrors.IsConflict(err) || apierrors.IsNotFound(err)) {
			return r.renew(ctx, now) // it changed, or is gone: read it (or make it) again, once
		}
		return err
	}
	r.last = updated
	return nil
}

// Leases is an informer of the heartbeat Leases of one namespace.
type Leases struct {
	namespace string
	informer  cache.SharedIndexInformer
}

// NewLeases returns the heartbeat Leases of namespace; register it with informers (which the
// caller starts and syncs) through Informer.
func NewLeases(client kube.Interface, namespace string) *Leases {
	inf := kube.NewInformer(client, client.CoordinationV1().Leases(namespace), &coordinationv1.Lease{}, func(o *metav1.ListOptions) {
		o.LabelSelector = labels.SelectorFromSet(labels.Set{gpuhealthv1.HeartbeatLeaseLabel: "true"}).String()
	})
	_ = inf.SetTransform(TrimLease)
	return &Leases{namespace: namespace, informer: inf}
}

// TrimLease is the informer transform of a heartbeat reader: it keeps only what a reader judges
// (the holder and the renewal), so that the Leases of 5,000 nodes cost a few hundred kB.
func TrimLease(obj any) (any, error) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return obj, nil
	}
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: l.Name, Namespace: l.Namespace, ResourceVersion: l.ResourceVersion},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: l.Spec.HolderIdentity, RenewTime: l.Spec.RenewTime},
	}, nil
}

// Informer is the Leases' informer, to add to the reader's kube.Informers before they start.
func (l *Leases) Informer() cache.SharedIndexInformer { return l.informer }

// Of returns the heartbeat Lease of node's agent, nil when it has none (no agent, or one of an
// earlier release that writes the heartbeat on the Node).
func (l *Leases) Of(node string) *coordinationv1.Lease {
	if l == nil {
		return nil
	}
	obj, ok, err := l.informer.GetStore().GetByKey(l.namespace + "/" + gpuhealthv1.HeartbeatLeaseName(node))
	if err != nil || !ok {
		return nil
	}
	lease, _ := obj.(*coordinationv1.Lease)
	return lease
}

// Judge judges node's heartbeat at now: its Lease when it has one, else annotations' (Judge).
func (l *Leases) Judge(node string, annotations map[string]string, now time.Time, staleAfter time.Duration) gpuhealthv1.Staleness {
	return Judge(node, annotations, l.Of(node), now, staleAfter)
}

// Renewed is when the agent of node last renewed lease (zero when it never did, or when the
// Lease names another holder: a hash collision, or one written by hand).
func Renewed(lease *coordinationv1.Lease, node string) time.Time {
	if lease == nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != node || lease.Spec.RenewTime == nil {
		return time.Time{}
	}
	return lease.Spec.RenewTime.Time
}

// Judge judges the heartbeat of node at now: its Lease's renewal when lease is not nil (one
// that names another holder, or was never renewed, is stale), else the Node's annotation, as an
// agent of an earlier release writes it (gpuhealthv1.JudgeHeartbeat).
func Judge(node string, annotations map[string]string, lease *coordinationv1.Lease, now time.Time, staleAfter time.Duration) gpuhealthv1.Staleness {
	if lease == nil {
		return gpuhealthv1.JudgeHeartbeat(annotations, now, staleAfter)
	}
	return gpuhealthv1.JudgeHeartbeatTime(Renewed(lease, node), now, staleAfter)
}
