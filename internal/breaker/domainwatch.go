package breaker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// Event reasons of the DomainWatcher, on the breaker's ConfigMap.
const (
	EventDomainFull   = "CircuitBreakerDomainFull"
	EventDomainClosed = "CircuitBreakerDomainClosed"
)

// EventRecorder is the part of client-go's record.EventRecorder the DomainWatcher uses.
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// DomainWatcher is the breaker controller's loop for the budgets per domain. It deletes the
// domain slots that stopped counting (left the window, or an acknowledgement came after them),
// whoever holds them, as the Sweeper does for the cluster's slots; and it reports a domain whose
// budget is used up as one finding, however many of its GPUs are held: a Warning Event
// CircuitBreakerDomainFull on the breaker's ConfigMap when it fills (CircuitBreakerDomainClosed
// when it has room again) and Full(label, value, true) for a metric. The agents hold the GPUs
// and say so on their own Nodes; this is the cluster's one line about the domain.
type DomainWatcher struct {
	Client    kube.Interface
	Namespace string
	Window    time.Duration
	// Domains are the labels and fractions the findings judge by (the agents' configuration).
	// Domain slots are swept with or without them.
	Domains  []Domain
	Clock    clock.Clock
	Interval time.Duration // between two rounds (default 10s)
	Recorder EventRecorder
	// Full, when set, hears each domain that fills (true) or has room again (false).
	Full func(label, value string, full bool)
	// Swept, when set, hears how many domain slots a round deleted.
	Swept func(n int)

	full map[string]DomainUse // the domains full at the last round, by label=value
}

// DomainUse is one domain value's budget and its live slots.
type DomainUse struct {
	DomainBudget
	Used int
}

// Run watches until ctx is done; errors are logged and retried at the next round.
func (w *DomainWatcher) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("controller", "breaker-domains")
	ctx = klog.NewContext(ctx, logger)
	return runRounds(ctx, w.Clock, w.Interval, "Watching the circuit breaker's domains failed; retrying",
		func(now time.Time) (time.Time, error) { return time.Time{}, w.Round(ctx, now) })
}

// Round sweeps the domain slots that stopped counting and reports the domains that filled or
// have room again since the last round.
func (w *DomainWatcher) Round(ctx context.Context, now time.Time) error {
	cm, err := w.Client.CoreV1().ConfigMaps(w.Namespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{}
	} else if err != nil {
		return fmt.Errorf("read the breaker's ConfigMap: %w", err)
	}
	_, acknowledged := ParseState(cm)
	cutoff := Cutoff(now, w.Window, acknowledged)
	list, err := w.Client.CoordinationV1().Leases(w.Namespace).List(ctx, metav1.ListOptions{LabelSelector: DomainSlotLabel})
	if err != nil {
		return fmt.Errorf("list the domain slots: %w", err)
	}
	live := map[string]int{} // by DomainKey
	var errs []error
	swept := 0
	for i := range list.Items {
		key := list.Items[i].Labels[DomainSlotLabel]
		pool := SlotPool{Client: w.Client, Namespace: w.Namespace, Prefix: SlotPrefix + key + "-"}
		for _, s := range pool.slots(list.Items[i : i+1]) {
			if s.Live(cutoff) {
				live[key]++
				continue
			}
			if err := pool.Release(ctx, s); err != nil {
				errs = append(errs, err)
				continue
			}
			swept++
		}
	}
	if w.Swept != nil && swept > 0 {
		w.Swept(swept)
	}
	w.report(ctx, cm, DomainsInUse(w.Domains, ParseDomainGPUs(cm), live))
	return errors.Join(errs...)
}

// DomainsInUse are the domain values of counted, under domains, with their live slots (by
// DomainKey), sorted by label and value.
func DomainsInUse(domains []Domain, counted DomainGPUs, live map[string]int) []DomainUse {
	var out []DomainUse
	for _, d := range domains {
		for _, v := range slices.Sorted(maps.Keys(counted[d.Label])) {
			n := counted[d.Label][v]
			out = append(out, DomainUse{DomainBudget: DomainBudget{Label: d.Label, Value: v, GPUs: n, Budget: Budget(d.MaxFraction, n)},
				Used: live[DomainKey(d.Label, v)]})
		}
	}
	return out
}

// Full reports whether the domain's budget is used up: its next GPU is held.
func (u DomainUse) Full() bool { return u.Used >= u.Budget }

// report posts one Event per domain that filled or has room again since the last round.
func (w *DomainWatcher) report(ctx context.Context, cm *corev1.ConfigMap, uses []DomainUse) {
	full := map[string]DomainUse{}
	for _, u := range uses {
		if u.Full() {
			full[u.String()] = u
		}
	}
	for name, u := range full {
		if _, was := w.full[name]; was {
			continue
		}
		klog.FromContext(ctx).Info("A circuit-breaker domain used up its budget", "domain", name, "used", u.Used, "budget", u.Budget, "gpus", u.GPUs)
		if w.Full != nil {
			w.Full(u.Label, u.Value, true)
		}
		if w.Recorder != nil && cm.UID != "" {
			w.Recorder.Eventf(cm, corev1.EventTypeWarning, EventDomainFull,
				"domain %s: %d of its %d GPUs turned NoSchedule/NoExecute within %v, its whole budget (%d); its further GPUs are tainted None until `gpuhealth breaker ack` or the window passes, while the rest of the cluster is admitted under the cluster's budget",
				name, u.Used, u.GPUs, w.Window, u.Budget)
		}
	}
	for name, u := range w.full {
		if _, still := full[name]; still {
			continue
		}
		if w.Full != nil {
			w.Full(u.Label, u.Value, false)
		}
		if w.Recorder != nil && cm.UID != "" {
			w.Recorder.Eventf(cm, corev1.EventTypeNormal, EventDomainClosed, "domain %s has room in its budget again", name)
		}
	}
	w.full = full
}
