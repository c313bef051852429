//go:build e2e

package fleet

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"golang.org/x/sync/errgroup"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The wave: one GPU in waveEvery fails at once across the fleet, and the test watches the Nodes
// and DeviceTaintRules converge (and, with the breaker, the budget hold).

// waitBreakerCount waits until the breaker's ConfigMap holds the cluster's GPU count.
func waitBreakerCount(t *testing.T, admin kubernetes.Interface, want int) {
	t.Helper()
	deadline := time.Now().Add(convergeLimit)
	for {
		cm, err := admin.CoreV1().ConfigMaps(agentNamespace).Get(t.Context(), breaker.ConfigMapName, metav1.GetOptions{})
		if err == nil {
			if n, _ := breaker.ParseState(cm); n == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the breaker's count never reached %d GPUs: %v, %v", want, cm, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// wave fails one GPU in ten at once and waits, through watches, until every DeviceTaintRule,
// annotation and condition it implies is in the API server; then checks the final state. The
// simulated nodes' failing GPUs get, at the same instant, what a real agent wrote for a fault on
// the GPU of the same index (templates); faults are the single faults before the wave (node →
// GPU), which stay.
func wave(t *testing.T, admin kubernetes.Interface, fleet []*fleetNode, counter *requestCounter, sims *simFleet, faults map[string]int, templates map[int]*agentWrites, fig *Figures) {
	t.Helper()
	ctx := t.Context()
	failing, wantIDs, wantRules := waveTargets(fleet)
	fig.WaveGPUs, fig.WaveNodes = len(wantRules), len(wantIDs)
	ruleNode := map[string]string{}
	realNodes := 0
	for n, gpus := range failing {
		for _, g := range gpus {
			ruleNode[devicetaint.RuleName(n.name, n.uuids[g])] = n.name
		}
		if !n.simulated {
			realNodes++
		}
	}
	simWrites, err := prepareSimWave(sims, failing, templates)
	if err != nil {
		t.Fatal(err)
	}
	nodes, rules := observeNodesAndRules(admin)
	watchCtx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	for _, o := range []*observed{nodes, rules} {
		existing, err := o.start(watchCtx)
		if err != nil {
			t.Fatal(err)
		}
		if o == rules && len(existing) != len(faults) {
			t.Fatalf("%d DeviceTaintRules before the wave, want the %d of the single faults", len(existing), len(faults))
		}
	}

	writesBefore := fleetWrites(t, fleet)
	before, bytesBefore := counter.snapshot(), counter.bytes()
	stopProfile := profileWave(t, admin, "wave")
	injected := time.Now()
	for n, idx := range failing {
		if n.simulated {
			continue
		}
		for _, g := range idx {
			n.backend.Signals <- health.Signal{Kind: health.SignalXID, Device: n.uuids[g], XID: waveXID, Time: injected}
		}
	}
	sendErrs := sendAll(ctx, simWrites, "gpuhealth-agent")
	taint := map[string][2]time.Duration{} // node → when its annotation and its rule were seen

	effects := &effectCount{effects: map[string]resourcev1.DeviceTaintEffect{}}
	pendingIDs := maps.Clone(wantIDs)
	pendingConds := maps.Clone(wantIDs)
	pendingRules := maps.Clone(wantRules)
	var lat []time.Duration // per object: annotation or rule
	var lastIDs, lastRules, lastConds time.Duration
	deadline := time.After(convergeLimit)
	for len(pendingIDs)+len(pendingRules)+len(pendingConds) > 0 {
		var obj k8sruntime.Object
		select {
		case obj = <-nodes.objects:
		case obj = <-rules.objects:
		case err := <-nodes.errs:
			t.Fatal(err)
		case err := <-rules.errs:
			t.Fatal(err)
		case err := <-sendErrs:
			if err != nil {
				t.Fatalf("simulated nodes' wave: %v", err)
			}
			sendErrs = nil // all sent
		case <-deadline:
			t.Fatalf("after %v: %d annotations, %d DeviceTaintRules and %d conditions still missing", convergeLimit, len(pendingIDs), len(pendingRules), len(pendingConds))
		}
		now := time.Since(injected)
		switch obj := obj.(type) {
		case *corev1.Node:
			if want, ok := pendingIDs[obj.Name]; ok && obj.Annotations[gpuhealthv1.UnhealthyIDsKey] == want {
				delete(pendingIDs, obj.Name)
				lat, lastIDs = append(lat, now), now
				seen := taint[obj.Name]
				seen[0] = now
				taint[obj.Name] = seen
			}
			if _, ok := pendingConds[obj.Name]; ok && conditionTrue(obj) {
				delete(pendingConds, obj.Name)
				lastConds = now
			}
		case *resourcev1.DeviceTaintRule:
			effects.see(obj)
			if pendingRules[obj.Name] {
				delete(pendingRules, obj.Name)
				lat, lastRules = append(lat, now), now
				seen := taint[ruleNode[obj.Name]]
				seen[1] = now
				taint[ruleNode[obj.Name]] = seen
			}
		}
	}
	stopProfile()
	if sendErrs != nil {
		if err := <-sendErrs; err != nil {
			t.Fatalf("simulated nodes' wave: %v", err)
		}
	}
	fig.WaveTaint = taintTimes(taint)
	held := fig.BreakerBudget > 0 && fig.BreakerBudget < len(wantRules)
	if held {
		// Part of the wave is held back: wait until exactly the budget has NoSchedule (agents
		// that lost every race for a slot retry), watching that it is never exceeded.
		for effects.disruptive() != fig.BreakerBudget {
			select {
			case obj := <-rules.objects:
				if r, ok := obj.(*resourcev1.DeviceTaintRule); ok {
					effects.see(r)
				}
			case err := <-rules.errs:
				t.Fatal(err)
			case <-deadline:
				t.Fatalf("after %v: %d rules NoSchedule, want the budget of %d", convergeLimit, effects.disruptive(), fig.BreakerBudget)
			}
		}
		fig.BreakerSettleSeconds = time.Since(injected).Seconds()
	}
	fig.BreakerMaxDisruptive = effects.max
	if fig.BreakerBudget > 0 && effects.max > fig.BreakerBudget {
		t.Errorf("%d rules had a disruptive effect at once, past the circuit breaker's budget of %d", effects.max, fig.BreakerBudget)
	}
	stopWatches()
	fig.WaveRewatches = int(nodes.rewatches.Load() + rules.rewatches.Load())
	fig.WaveAnnotationsSeconds, fig.WaveRulesSeconds, fig.WaveConditionsSeconds = lastIDs.Seconds(), lastRules.Seconds(), lastConds.Seconds()
	fig.WaveAllSeconds = max(lastIDs, lastRules).Seconds()
	slices.Sort(lat)
	fig.WaveP50Seconds, fig.WaveP99Seconds = percentile(lat, 0.50).Seconds(), percentile(lat, 0.99).Seconds()

	// Let the writers settle (Events are batched by the broadcaster), then count and check.
	time.Sleep(3 * time.Second)
	fig.WaveByKind = diff(counter.snapshot(), before)
	fig.WaveRequests = total(fig.WaveByKind)
	fig.WaveBytes = counter.bytes() - bytesBefore
	fig.WaveWindowSeconds = time.Since(injected).Seconds()
	writesAfter := fleetWrites(t, fleet)
	fig.WaveWrites = map[string]int{}
	for k, v := range writesAfter {
		fig.WaveWrites[k] = v - writesBefore[k]
	}
	finalIDs, finalRules := maps.Clone(wantIDs), maps.Clone(wantRules)
	for _, n := range fleet {
		if g, ok := faults[n.name]; ok {
			finalIDs[n.name] = strconv.Itoa(g)
			finalRules[devicetaint.RuleName(n.name, n.uuids[g])] = true
		}
	}
	checkFinalState(t, admin, fleet, finalIDs, finalRules)
	if held {
		checkBudget(t, admin, fig.BreakerBudget, len(wantRules))
	}
	// One write per changed object by the real agents (the simulated nodes' writes are the test's).
	for sink, want := range map[string]int{"annotation": realNodes, "devicetaint": realNodes, "condition": realNodes} {
		if held && sink != "annotation" {
			continue // held GPUs may be written twice (None, then NoSchedule) and get the breaker's condition
		}
		if slices.Contains(fig.Reporters, sink) && fig.WaveWrites[sink] != want {
			t.Errorf("%s: %d writes for the wave, want %d (one per changed object)", sink, fig.WaveWrites[sink], want)
		}
	}
}

// waveTargets returns the wave's failing GPUs: every tenth of the fleet, so at most one per node
// (8 in a row hold at most one multiple of 10), spread over the nodes like independent failures;
// with the volcano.sh/gpu-unhealthy-ids each failing node must get and the rules expected.
func waveTargets(fleet []*fleetNode) (failing map[*fleetNode][]int, wantIDs map[string]string, wantRules map[string]bool) {
	failing, wantIDs, wantRules = map[*fleetNode][]int{}, map[string]string{}, map[string]bool{}
	for i, n := range fleet {
		for g := range gpusPerNode {
			if (i*gpusPerNode+g)%waveEvery != 0 {
				continue
			}
			failing[n] = append(failing[n], g)
			wantRules[devicetaint.RuleName(n.name, n.uuids[g])] = true
		}
	}
	for n, idx := range failing {
		ids := make([]string, len(idx))
		for i, g := range idx {
			ids[i] = strconv.Itoa(g)
		}
		wantIDs[n.name] = strings.Join(ids, ",")
	}
	return failing, wantIDs, wantRules
}

// observeNodesAndRules returns observers of the Nodes and the DeviceTaintRules. Each watches from
// the resourceVersion of its start, so every event seen is new. A watch the API server closes (an
// overloaded server drops a watcher that falls behind) is reopened after a fresh LIST, whose
// items count as seen then: nothing is missed, only seen later.
func observeNodesAndRules(admin kubernetes.Interface) (nodes, rules *observed) {
	nodes = &observed{
		list: listing(func(ctx context.Context, o metav1.ListOptions) (k8sruntime.Object, error) {
			return admin.CoreV1().Nodes().List(ctx, o)
		}),
		watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return admin.CoreV1().Nodes().Watch(ctx, opts)
		},
	}
	rules = &observed{
		list: listing(func(ctx context.Context, o metav1.ListOptions) (k8sruntime.Object, error) {
			return admin.ResourceV1().DeviceTaintRules().List(ctx, o)
		}),
		watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return admin.ResourceV1().DeviceTaintRules().Watch(ctx, opts)
		},
	}
	return nodes, rules
}

// effectCount follows the effect of every rule seen, and the most rules ever seen with a
// disruptive effect (NoSchedule or NoExecute) at once.
type effectCount struct {
	effects map[string]resourcev1.DeviceTaintEffect
	max     int
}

func (e *effectCount) see(r *resourcev1.DeviceTaintRule) {
	e.effects[r.Name] = r.Spec.Taint.Effect
	e.max = max(e.max, e.disruptive())
}

func (e *effectCount) disruptive() int {
	n := 0
	for _, eff := range e.effects {
		if eff != resourcev1.DeviceTaintEffectNone {
			n++
		}
	}
	return n
}

// checkBudget lists the rules and checks that exactly budget of the wave's GPUs have NoSchedule
// and the rest None.
func checkBudget(t *testing.T, admin kubernetes.Interface, budget, wave int) {
	t.Helper()
	rules, err := admin.ResourceV1().DeviceTaintRules().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byEffect := map[resourcev1.DeviceTaintEffect]int{}
	for _, r := range rules.Items {
		byEffect[r.Spec.Taint.Effect]++
	}
	if byEffect[resourcev1.DeviceTaintEffectNoSchedule] != budget || byEffect[resourcev1.DeviceTaintEffectNone] != wave-budget {
		t.Errorf("rules by effect %v, want %d NoSchedule (the budget) and %d None", byEffect, budget, wave-budget)
	}
}

// listing adapts a typed List call to observed.list: the list's resourceVersion and its items.
func listing(list func(context.Context, metav1.ListOptions) (k8sruntime.Object, error)) func(context.Context) (string, []k8sruntime.Object, error) {
	return func(ctx context.Context) (string, []k8sruntime.Object, error) {
		l, err := list(ctx, metav1.ListOptions{})
		if err != nil {
			return "", nil, err
		}
		items, err := meta.ExtractList(l)
		if err != nil {
			return "", nil, err
		}
		acc, err := meta.ListAccessor(l)
		if err != nil {
			return "", nil, err
		}
		return acc.GetResourceVersion(), items, nil
	}
}

// observed follows one kind of object through a watch and hands every added or modified object
// to objects; when the API server closes the watch it lists again (handing over every item) and
// watches from there.
type observed struct {
	list      func(context.Context) (string, []k8sruntime.Object, error)
	watch     func(context.Context, metav1.ListOptions) (watch.Interface, error)
	objects   chan k8sruntime.Object
	errs      chan error
	rewatches atomic.Int64
}

// start lists, returns the items there now, and follows changes from there until ctx is done.
func (o *observed) start(ctx context.Context) ([]k8sruntime.Object, error) {
	o.objects, o.errs = make(chan k8sruntime.Object, 1024), make(chan error, 1)
	rv, items, err := o.list(ctx)
	if err != nil {
		return nil, err
	}
	w, err := o.watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
	if err != nil {
		return nil, err
	}
	go func() {
		defer func() { w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
					select {
					case o.objects <- ev.Object:
					case <-ctx.Done():
						return
					}
				}
				if ok && ev.Type != watch.Error {
					continue
				}
				// Closed, or an error (such as a resourceVersion too old): list and watch again.
				w.Stop()
				o.rewatches.Add(1)
				rv, items, err := o.list(ctx)
				if err == nil {
					w, err = o.watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
				}
				if err != nil {
					if ctx.Err() == nil {
						o.errs <- err
					}
					return
				}
				for _, obj := range items {
					select {
					case o.objects <- obj:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return items, nil
}

// checkFinalState lists what the API server holds and compares it with the wave's expectation:
// exactly the expected rules, and the expected unhealthy-ids annotation on exactly the failing
// nodes (the other nodes have none).
func checkFinalState(t *testing.T, admin kubernetes.Interface, fleet []*fleetNode, wantIDs map[string]string, wantRules map[string]bool) {
	t.Helper()
	ctx := t.Context()
	rules, err := admin.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range rules.Items {
		got[r.Name] = true
		if !wantRules[r.Name] {
			t.Errorf("unexpected DeviceTaintRule %s", r.Name)
		}
	}
	for name := range wantRules {
		if !got[name] {
			t.Errorf("DeviceTaintRule %s missing", name)
		}
	}
	nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != len(fleet) {
		t.Errorf("%d nodes, want %d", len(nodes.Items), len(fleet))
	}
	for _, n := range nodes.Items {
		if got, want := n.Annotations[gpuhealthv1.UnhealthyIDsKey], wantIDs[n.Name]; got != want {
			t.Errorf("node %s: %s=%q, want %q", n.Name, gpuhealthv1.UnhealthyIDsKey, got, want)
		}
		if n.Annotations[gpuhealthv1.HealthKey] == "" {
			t.Errorf("node %s: no %s annotation", n.Name, gpuhealthv1.HealthKey)
		}
	}
}

// sendAll sends every node's writes of writes, simSenders nodes at a time, and then says on the
// channel returned how that went (nil: all sent).
func sendAll(ctx context.Context, writes []*simWrite, manager string) <-chan error {
	done := make(chan error, 1)
	var g errgroup.Group
	g.SetLimit(simSenders)
	go func() {
		for _, w := range writes {
			g.Go(func() error { return w.send(ctx, manager) })
		}
		done <- g.Wait()
	}()
	return done
}

// taintTimes are the percentiles, over the nodes of seen, of the later of the two times seen
// holds: its annotation's and its rule's (each failing node has one failing GPU).
func taintTimes(seen map[string][2]time.Duration) Percentiles {
	d := make([]time.Duration, 0, len(seen))
	for _, s := range seen {
		d = append(d, max(s[0], s[1]))
	}
	return percentiles(d)
}

func conditionTrue(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == nodecondition.Type {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
