package breaker

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

const ns = "gpuhealth-system"

func countConfigMap(gpus int) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ConfigMapName}, Data: map[string]string{ClusterGPUsKey: strconv.Itoa(gpus)}}
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
	client := fake.NewClientset(countConfigMap(16))
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
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
	// After the window the slots are free again, and taken over.
	if !admit(t, b, "GPU-b-99") {
		t.Error("after the window: not admitted")
	}
	if slots, _ := ListSlots(context.Background(), adapt.Clientset(client), ns); len(slots) != 4 {
		t.Errorf("%d slots after a take-over, want the same 4", len(slots))
	}
}

func TestAcknowledgeFreesTheBudget(t *testing.T) {
	client := fake.NewClientset(countConfigMap(4))
	clk := clocktesting.NewFakeClock(time.Now())
	b, _ := started(t, client, "a", 0.25, time.Hour, clk)
	if !admit(t, b, "GPU-a-0") {
		t.Fatal("the first GPU was not admitted (a budget is at least 1)")
	}
	if admit(t, b, "GPU-a-1") {
		t.Fatal("a second GPU was admitted past a budget of 1")
	}
	clk.Step(time.Second)
	if err := Acknowledge(context.Background(), adapt.Clientset(client), ns, clk.Now()); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
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

func nodeMeta(name, healthJSON string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{gpuhealthv1.HealthKey: healthJSON}},
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

func TestCounterWritesTheClusterGPUCount(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	scheme := runtime.NewScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	meta := metadatafake.NewSimpleMetadataClient(scheme,
		nodeMeta("a", gpus("a", 8)),
		// MIG instances name their parent and are not counted again.
		nodeMeta("b", `{"GPU-b-0":{"index":0,"health":"Healthy"},"MIG-b-0-1":{"index":0,"health":"Healthy","parentUUID":"GPU-b-0"}}`),
		nodeMeta("c", "not json"),
	)
	client := fake.NewClientset()
	done := make(chan error, 1)
	var counted atomic.Int32
	go func() {
		done <- (&Counter{Client: adapt.Clientset(client), Metadata: meta, Namespace: ns, Counted: func(n int) { counted.Store(int32(n)) }}).Run(ctx)
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
	waitCount(9)
	nodes := meta.Resource(nodesResource)
	if _, err := nodes.(interface {
		CreateFake(*metav1.PartialObjectMetadata, metav1.CreateOptions, ...string) (*metav1.PartialObjectMetadata, error)
	}).CreateFake(nodeMeta("d", gpus("d", 4)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCount(13)
	for deadline := time.Now().Add(5 * time.Second); counted.Load() != 13; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Counted last saw %d, want 13", counted.Load())
		}
	}
	// An acknowledgement written meanwhile is kept.
	if err := Acknowledge(ctx, adapt.Clientset(client), ns, time.Now()); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	cm, err := client.CoreV1().ConfigMaps(ns).Get(context.Background(), ConfigMapName, metav1.GetOptions{})
	if err != nil || cm.Data[AcknowledgedAtKey] == "" || cm.Data[ClusterGPUsKey] != "13" {
		t.Errorf("ConfigMap = %v, %v; want the count and the acknowledgement", cm, err)
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
