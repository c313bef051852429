package breaker

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/kube/kubetest"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

const ns = "gpuhealth-system"

func countConfigMap(gpus int) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ConfigMapName}, Data: map[string]string{ClusterGPUsKey: strconv.Itoa(gpus)}}
}

// serverTime makes the fake clientset date every Lease it creates with clk, as the API server
// dates creationTimestamp with its own clock.
func serverTime(client *fake.Clientset, clk clock.PassiveClock) *fake.Clientset {
	return kubetest.StampCreation(client, "leases", clk)
}

// started returns a started Breaker for node and a counter of its onChange calls.
func started(t *testing.T, client *fake.Clientset, node string, fraction float64, window time.Duration, clk *clocktesting.FakeClock) (*Breaker, *atomic.Int32) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	b := New(adapt.Clientset(client), node, Options{Namespace: ns, MaxFraction: fraction, Window: window, Clock: clk})
	var changes atomic.Int32
	if err := b.Start(ctx, func() { changes.Add(1) }); err != nil {
		t.Fatal(err)
	}
	return b, &changes
}

func admit(t *testing.T, b *Breaker, uuid string) bool {
	t.Helper()
	ok, err := b.Admit(context.Background(), uuid)
	if err != nil {
		t.Fatalf("Admit(%s): %v", uuid, err)
	}
	return ok
}

func TestBudgetIsSharedAndExpires(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	client := serverTime(fake.NewClientset(countConfigMap(16)), clk)
	a, _ := started(t, client, "a", 0.25, 10*time.Minute, clk)
	b, changes := started(t, client, "b", 0.25, 10*time.Minute, clk)
	// Two agents share a budget of 4 slots. (That agents racing for slots cannot overrun it rests
	// on the API server creating a name once; the e2e test TestCircuitBreakerStopsAMassEviction
	// and the fleet test prove it against a real one.)
	admitted := 0
	for i := range 6 {
		for _, br := range []*Breaker{a, b} {
			if admit(t, br, fmt.Sprintf("GPU-%s-%d", br.nodeName, i)) {
				admitted++
			}
		}
	}
	if admitted != 4 {
		t.Fatalf("%d admitted, want the budget of 4", admitted)
	}
	if !admit(t, a, "GPU-a-0") {
		t.Error("an admitted GPU is no longer admitted")
	}
	if admit(t, a, "GPU-a-99") {
		t.Error("a fifth GPU was admitted")
	}
	slots, err := ListSlots(context.Background(), adapt.Clientset(client), ns)
	if err != nil || len(slots) != 4 {
		t.Fatalf("ListSlots = %v, %v; want 4 slots", slots, err)
	}
	for _, s := range slots {
		if s.Index < 0 || s.Index >= 4 || s.Node == "" || s.UUID == "" {
			t.Errorf("slot %+v: want an index below the budget, a node and a GPU", s)
		}
	}
	// The held agent is asked to look again when the oldest slot leaves the window.
	before := changes.Load()
	admit(t, b, "GPU-b-99")
	clk.Step(11 * time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for changes.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("no re-check after the window passed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// After the window the slots no longer count, but only the Sweeper frees them: agents never
	// change or delete a breaker slot.
	if admit(t, b, "GPU-b-99") {
		t.Error("after the window: admitted before the stale slots were swept")
	}
	sweeper := &Sweeper{Pools: []SweptPool{BreakerPool(BreakerSlots(adapt.Clientset(client), ns), 10*time.Minute, AcknowledgedAt(adapt.Clientset(client), ns))}}
	if _, err := sweeper.Sweep(context.Background(), clk.Now()); err != nil {
		t.Fatal(err)
	}
	if !admit(t, b, "GPU-b-99") {
		t.Error("after the window and a sweep: not admitted")
	}
	if slots, _ := ListSlots(context.Background(), adapt.Clientset(client), ns); len(slots) != 1 {
		t.Errorf("%d slots after the sweep and one admission, want 1", len(slots))
	}
}

func TestAcknowledgeFreesTheBudget(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	client := serverTime(fake.NewClientset(countConfigMap(4)), clk)
	b, _ := started(t, client, "a", 0.25, time.Hour, clk)
	if !admit(t, b, "GPU-a-0") {
		t.Fatal("the first GPU was not admitted (a budget is at least 1)")
	}
	if admit(t, b, "GPU-a-1") {
		t.Fatal("a second GPU was admitted past a budget of 1")
	}
	clk.Step(time.Second)
	if _, err := Acknowledge(context.Background(), adapt.Clientset(client), ns, clk.Now()); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	sweeper := &Sweeper{Pools: []SweptPool{BreakerPool(BreakerSlots(adapt.Clientset(client), ns), time.Hour, AcknowledgedAt(adapt.Clientset(client), ns))}}
	if _, err := sweeper.Sweep(context.Background(), clk.Now()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !admit(t, b, "GPU-a-1") {
		if time.Now().After(deadline) {
			t.Fatal("the acknowledgement did not let the held GPU through")
		}
		time.Sleep(10 * time.Millisecond) // the informer sees the acknowledgement
	}
}

func TestWithoutACountEveryEscalationIsAdmitted(t *testing.T) {
	client := fake.NewClientset()
	b, _ := started(t, client, "a", 0.1, time.Hour, clocktesting.NewFakeClock(time.Now()))
	for i := range 3 {
		if !admit(t, b, fmt.Sprintf("GPU-%d", i)) {
			t.Fatal("held back without a cluster count: a missing count must not keep sick GPUs schedulable")
		}
	}
	if slots, _ := ListSlots(context.Background(), adapt.Clientset(client), ns); len(slots) != 0 {
		t.Errorf("slots taken without a budget: %v", slots)
	}
}

func TestParseState(t *testing.T) {
	cm := &corev1.ConfigMap{Data: map[string]string{ClusterGPUsKey: "x", AcknowledgedAtKey: "yesterday"}}
	if n, at := ParseState(cm); n != 0 || !at.IsZero() {
		t.Errorf("ParseState of malformed values = %d, %v; want absent", n, at)
	}
	cm.Data = map[string]string{ClusterGPUsKey: "64", AcknowledgedAtKey: "2026-11-30T10:00:00Z"}
	if n, at := ParseState(cm); n != 64 || at.IsZero() {
		t.Errorf("ParseState = %d, %v", n, at)
	}
}

func TestHeldChanges(t *testing.T) {
	b := New(nil, "a", Options{})
	if !b.SetHeld([]string{"y", "x"}) || b.SetHeld([]string{"x", "y"}) || !b.SetHeld(nil) {
		t.Error("SetHeld must report changes of the set only")
	}
}

func node(name, healthJSON string, capacity corev1.ResourceList) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{gpuhealthv1.HealthKey: healthJSON}},
		Status:     corev1.NodeStatus{Capacity: capacity},
	}
}

func gpus(node string, n int) string {
	s := "{"
	for i := range n {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(`"GPU-%s-%d":{"index":%d,"health":"Healthy"}`, node, i, i)
	}
	return s + "}"
}

// gpuSlice publishes n GPUs of node, each with a MIG partition at the same PCI address.
func gpuSlice(node string, n int) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpus"},
		Spec:       resourceapi.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}},
	}
	for i := range n {
		bus := resourceapi.DeviceAttribute{StringValue: ptr.To(fmt.Sprintf("0000:%02x:00.0", i+1))}
		uuid := fmt.Sprintf("GPU-%s-%d", node, i)
		s.Spec.Devices = append(s.Spec.Devices,
			resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid": {StringValue: &uuid}, "resource.kubernetes.io/pciBusID": bus}},
			resourceapi.Device{Name: fmt.Sprintf("gpu-%d-mig-1g10gb-0", i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"parentUUID": {StringValue: &uuid}, "resource.kubernetes.io/pciBusID": bus}})
	}
	return s
}

func TestCounterWritesTheClusterGPUCount(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(
		node("a", gpus("a", 8), nil),
		// MIG instances name their parent and are not counted again.
		node("b", `{"GPU-b-0":{"index":0,"health":"Healthy"},"MIG-b-0-1":{"index":0,"health":"Healthy","parentUUID":"GPU-b-0"}}`, nil),
		node("c", "not json", nil),
		// Inflated annotations count for what others say the node has: its ResourceSlices (2
		// GPUs, MIG partitions not counted again), or its device plugin's capacity (3).
		node("dra", gpus("dra", 500), nil), gpuSlice("dra", 2),
		node("plugin", gpus("plugin", 500), corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("3"), "cpu": resource.MustParse("96")}),
		// Fewer GPUs reported than published: the report counts.
		node("few", gpus("few", 1), corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("7")}), gpuSlice("few", 4),
	)
	done := make(chan error, 1)
	var counted atomic.Int32
	go func() {
		done <- (&Counter{Client: adapt.Clientset(client), Namespace: ns, Counted: func(n int) { counted.Store(int32(n)) }}).Run(ctx)
	}()
	waitCount := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, ConfigMapName, metav1.GetOptions{})
			if err == nil && cm.Data[ClusterGPUsKey] == strconv.Itoa(want) && cm.Data[CountedAtKey] != "" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster GPU count never became %d (%v, %v)", want, cm, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitCount(8 + 1 + 0 + 2 + 3 + 1)
	if _, err := client.CoreV1().Nodes().Create(ctx, node("d", gpus("d", 4), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCount(19)
	// A node without slices or capacity counts for at most MaxGPUsPerNode.
	if _, err := client.CoreV1().Nodes().Create(ctx, node("huge", gpus("huge", 6121), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCount(19 + MaxGPUsPerNode)
	for deadline := time.Now().Add(5 * time.Second); counted.Load() != 19+MaxGPUsPerNode; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Counted last saw %d, want %d", counted.Load(), 19+MaxGPUsPerNode)
		}
	}
	// An acknowledgement written meanwhile is kept.
	if _, err := Acknowledge(ctx, adapt.Clientset(client), ns, time.Now()); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	cm, err := client.CoreV1().ConfigMaps(ns).Get(context.Background(), ConfigMapName, metav1.GetOptions{})
	if err != nil || cm.Data[AcknowledgedAtKey] == "" || cm.Data[ClusterGPUsKey] != strconv.Itoa(19+MaxGPUsPerNode) {
		t.Errorf("ConfigMap = %v, %v; want the count and the acknowledgement", cm, err)
	}
}

// TestSlotsCountByTheServersTime: a slot whose holder wrote an acquireTime in 2099 counts from
// when the API server created it, so it leaves the window like any other and an acknowledgement
// releases it (before, it held the budget forever).
func TestSlotsCountByTheServersTime(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	client := serverTime(fake.NewClientset(countConfigMap(10)), clk)
	future := metav1.NewMicroTime(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
	if _, err := client.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: SlotPrefix + "0", Namespace: ns, Labels: map[string]string{SlotLabel: "true"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("evil/GPU-x"), AcquireTime: &future},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b, _ := started(t, client, "a", 0.1, 10*time.Minute, clk)
	if admit(t, b, "GPU-a-0") {
		t.Fatal("admitted past a budget of 1 held by a live slot")
	}
	slots, err := ListSlots(ctx, adapt.Clientset(client), ns)
	if err != nil || len(slots) != 1 || !slots[0].At.Equal(clk.Now()) {
		t.Fatalf("slots %+v, %v: want one dated by its creation, not its acquireTime", slots, err)
	}
	clk.Step(11 * time.Minute)
	sweeper := &Sweeper{Pools: []SweptPool{BreakerPool(BreakerSlots(adapt.Clientset(client), ns), 10*time.Minute, AcknowledgedAt(adapt.Clientset(client), ns))}}
	if _, err := sweeper.Sweep(ctx, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if !admit(t, b, "GPU-a-0") {
		t.Error("the slot dated 2099 still holds the budget after the window")
	}
}

// TestSweeperDeletesOnlyWhatStoppedCounting: breaker slots out of the window and expired
// remediation slots go, whoever holds them; live ones and slots without a duration stay, and the
// next sweep is due when the first live slot stops counting.
func TestSweeperDeletesOnlyWhatStoppedCounting(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	client := serverTime(fake.NewClientset(), clk)
	kc := adapt.Clientset(client)
	remediationPool := SlotPool{Client: kc, Namespace: ns, Prefix: "gpuhealth-remediation-slot-", Label: "gpuhealth.dev/remediation-slot", OwnerReleases: true}
	take := func(p SlotPool, k int, node string, d time.Duration) {
		t.Helper()
		if ok, err := p.Take(ctx, k, nil, SlotClaim{Node: node, UUID: "GPU-" + node, At: clk.Now(), Duration: d}); !ok || err != nil {
			t.Fatalf("Take(%s%d) = %v, %v", p.Prefix, k, ok, err)
		}
	}
	take(BreakerSlots(kc, ns), 0, "old", 0)
	take(remediationPool, 0, "old", 5*time.Minute)
	clk.Step(8 * time.Minute)
	take(BreakerSlots(kc, ns), 1, "new", 0)
	take(remediationPool, 1, "new", 5*time.Minute)
	take(remediationPool, 2, "forever", 0)
	clk.Step(3 * time.Minute) // old breaker slot: 11 min (window 10); old repair: expired
	swept := map[string]int{}
	w := &Sweeper{
		Pools: []SweptPool{BreakerPool(BreakerSlots(kc, ns), 10*time.Minute, func(context.Context) time.Time { return time.Time{} }), ExpiringPool(remediationPool)},
		Swept: func(prefix string, n int) { swept[prefix] += n },
	}
	next, err := w.Sweep(ctx, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	names := func(p SlotPool) (out []string) {
		slots, err := p.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots {
			out = append(out, s.Node)
		}
		return out
	}
	if got := names(BreakerSlots(kc, ns)); !slices.Equal(got, []string{"new"}) {
		t.Errorf("breaker slots left %v, want [new]", got)
	}
	if got := names(remediationPool); !slices.Equal(got, []string{"new", "forever"}) {
		t.Errorf("remediation slots left %v, want [new forever]", got)
	}
	if swept[SlotPrefix] != 1 || swept[remediationPool.Prefix] != 1 {
		t.Errorf("swept %v", swept)
	}
	// Next: the new repair expires 5 min after it began (2 min from now), before the new breaker
	// slot leaves the window (7 min from now).
	if want := clk.Now().Add(2 * time.Minute); !next.Equal(want) {
		t.Errorf("next sweep due %v, want %v", next, want)
	}
}

func TestPhysicalGPUs(t *testing.T) {
	// One node's annotation claiming 6,121 GPUs counts for MaxGPUsPerNode.
	for in, want := range map[string]int{"": 0, "{}": 0, "[1]": 0, gpus("x", 3): 3, gpus("x", 6121): MaxGPUsPerNode} {
		if got := PhysicalGPUs(in); got != want {
			t.Errorf("PhysicalGPUs(%q) = %d, want %d", in, got, want)
		}
	}
}

// TestCounterLeavesStaleNodesOut: a node whose agent stopped confirming its report counts for no
// GPUs (nor does an unreadable heartbeat); it is counted again once it reports, and without
// StaleAfter every node counts.
func TestCounterLeavesStaleNodesOut(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	beat := func(n *corev1.Node, v string) *corev1.Node { n.Annotations[gpuhealthv1.HeartbeatKey] = v; return n }
	client := fake.NewClientset(
		beat(node("alive", gpus("alive", 8), nil), gpuhealthv1.FormatHeartbeat(time.Now())),
		beat(node("dead", gpus("dead", 8), nil), gpuhealthv1.FormatHeartbeat(time.Now().Add(-time.Hour))),
		beat(node("garbage", gpus("garbage", 8), nil), "now-ish"),
		node("old-agent", gpus("old-agent", 2), nil),
	)
	var stale atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- (&Counter{Client: adapt.Clientset(client), Namespace: ns, StaleAfter: 15 * time.Minute, Stale: func(n int) { stale.Store(int32(n)) }}).Run(ctx)
	}()
	waitCM := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, ConfigMapName, metav1.GetOptions{})
			if err == nil && cm.Data[ClusterGPUsKey] == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("count never became %s: %v %v", want, cm, err)
			}
		}
	}
	waitCM("10")
	if stale.Load() != 2 {
		t.Errorf("%d stale nodes reported, want 2", stale.Load())
	}
	dead, err := client.CoreV1().Nodes().Get(ctx, "dead", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Update(ctx, beat(dead, gpuhealthv1.FormatHeartbeat(time.Now())), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCM("18")
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}
