package breaker

import (
	"context"
	"errors"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// Sweeper deletes slots that no longer count, whoever holds them: an agent may delete only its
// own node's slots (the admission policy), so the slots of a node whose agent died, or that a
// hostile agent left, would otherwise keep their index from ever being taken again. The breaker
// controller runs it next to the Counter.
type Sweeper struct {
	// Pools are swept in turn, each with its own rule for a slot that stopped counting.
	Pools []SweptPool
	Clock clock.Clock
	// Interval is the longest between two sweeps (default 10s: an acknowledgement frees the slots
	// it ends within it; a sweep is one LIST of the few slot Leases); a sweep also runs when the next
	// listed slot stops counting.
	Interval time.Duration
	// Swept, when set, hears how many slots of a pool each sweep deleted.
	Swept func(prefix string, n int)
}

// SweptPool is a pool and its rule: Stale reports whether a slot no longer counts at now, and
// Ends when a slot that counts now stops (zero: not by itself).
type SweptPool struct {
	Pool  SlotPool
	Stale func(ctx context.Context, s Slot, now time.Time) bool
	Ends  func(s Slot) time.Time
}

// BreakerPool is the circuit breaker's pool for Sweeper: a slot is stale once it
// left window or an acknowledgement (read from the breaker's ConfigMap at each sweep) came after it.
func BreakerPool(pool SlotPool, window time.Duration, acknowledged func(context.Context) time.Time) SweptPool {
	return SweptPool{
		Pool: pool,
		Stale: func(ctx context.Context, s Slot, now time.Time) bool {
			return !s.Live(Cutoff(now, window, acknowledged(ctx)))
		},
		Ends: func(s Slot) time.Time { return s.At.Add(window) },
	}
}

// AcknowledgedAt reads the last acknowledgement from the breaker's ConfigMap in namespace (zero
// when there is none or it cannot be read: the window alone then decides).
func AcknowledgedAt(client kube.Interface, namespace string) func(context.Context) time.Time {
	return func(ctx context.Context) time.Time {
		cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return time.Time{}
		}
		_, at := ParseState(cm)
		return at
	}
}

// ExpiringPool is a pool of slots taken with a duration (remediation's) for Sweeper: a slot is
// stale once it expired; one with no duration never is.
func ExpiringPool(pool SlotPool) SweptPool {
	return SweptPool{
		Pool: pool,
		Stale: func(_ context.Context, s Slot, now time.Time) bool {
			return !s.Expires.IsZero() && !s.Expires.After(now)
		},
		Ends: func(s Slot) time.Time { return s.Expires },
	}
}

// Run sweeps until ctx is done. Errors are logged and retried at the next sweep.
func (w *Sweeper) Run(ctx context.Context) error {
	logged := klog.NewContext(ctx, klog.FromContext(ctx).WithValues("controller", "slot-sweeper"))
	return runRounds(logged, w.Clock, w.Interval, "Sweeping slots that no longer count failed; retrying",
		func(now time.Time) (time.Time, error) { return w.Sweep(ctx, now) })
}

// Sweep deletes every stale slot of every pool once and returns when the next slot that counts
// now stops (zero: none does).
func (w *Sweeper) Sweep(ctx context.Context, now time.Time) (next time.Time, err error) {
	logger := klog.FromContext(ctx)
	var errs []error
	for _, p := range w.Pools {
		slots, err := p.Pool.List(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		deleted := 0
		for _, s := range slots {
			if !p.Stale(ctx, s, now) {
				if end := p.Ends(s); !end.IsZero() && (next.IsZero() || end.Before(next)) {
					next = end
				}
				continue
			}
			if err := p.Pool.Release(ctx, s); err != nil {
				errs = append(errs, err)
				continue
			}
			deleted++
			logger.V(2).Info("Deleted a slot that no longer counts", "slot", p.Pool.Prefix+strconv.Itoa(s.Index), "holder", Holder(s.Node, s.UUID), "since", s.At)
		}
		if w.Swept != nil && deleted > 0 {
			w.Swept(p.Pool.Prefix, deleted)
		}
	}
	return next, errors.Join(errs...)
}
