package breaker

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/report/annotation"
)

// gpuNode is a Node whose agent reports n GPUs.
func gpuNode(name string, n int) *corev1.Node {
	health := "{"
	for i := range n {
		if i > 0 {
			health += ","
		}
		health += fmt.Sprintf(`"GPU-%s-%d":{"index":%d,"health":"Healthy"}`, name, i, i)
	}
	health += "}"
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{annotation.HealthKey: health}}}
}

func TestBudgetIsSharedAndExpires(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(gpuNode("a", 8), gpuNode("b", 8))
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	newBreaker := func(node string) *Breaker {
		b := New(client, node, Options{Namespace: "ns", MaxFraction: 0.25, Window: 10 * time.Minute, Clock: clk})
		if err := b.Start(ctx, func() {}); err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := newBreaker("a"), newBreaker("b")
	if got := a.ClusterGPUs(); got != 16 {
		t.Fatalf("ClusterGPUs = %d, want 16", got)
	}
	// Two agents share a budget of 4. (That concurrent agents cannot overrun it rests on the API
	// server's optimistic concurrency, which the fake clientset does not model: the e2e test
	// TestCircuitBreakerStopsAMassEviction proves it against a real one.)
	admitted := 0
	for i := range 6 {
		for _, br := range []*Breaker{a, b} {
			ok, err := br.Admit(ctx, fmt.Sprintf("GPU-%s-%d", br.nodeName, i))
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				admitted++
			}
		}
	}
	if admitted != 4 {
		t.Fatalf("%d admitted, want the budget of 4", admitted)
	}
	if ok, _ := a.Admit(ctx, "GPU-a-0"); !ok {
		t.Error("an admitted GPU is no longer admitted")
	}
	// An admitted GPU stays admitted; a new one waits.
	if ok, _ := a.Admit(ctx, "GPU-a-99"); ok {
		t.Error("a fifth GPU was admitted")
	}
	// After the window the budget is free again.
	clk.Step(11 * time.Minute)
	if ok, err := a.Admit(ctx, "GPU-a-99"); !ok || err != nil {
		t.Errorf("after the window: %v, %v; want admitted", ok, err)
	}
}

func TestAcknowledgeFreesTheBudget(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(gpuNode("a", 4))
	clk := clocktesting.NewFakeClock(time.Now())
	b := New(client, "a", Options{Namespace: "ns", MaxFraction: 0.25, Window: time.Hour, Clock: clk})
	if err := b.Start(ctx, func() {}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := b.Admit(ctx, "GPU-a-0"); !ok {
		t.Fatal("the first GPU was not admitted (a budget is at least 1)")
	}
	if ok, _ := b.Admit(ctx, "GPU-a-1"); ok {
		t.Fatal("a second GPU was admitted past a budget of 1")
	}
	clk.Step(time.Second)
	if err := Acknowledge(ctx, client, "ns", clk.Now()); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	if ok, _ := b.Admit(ctx, "GPU-a-1"); !ok {
		t.Error("the acknowledgement did not let the held GPU through")
	}
}

func TestHeldChanges(t *testing.T) {
	b := New(nil, "a", Options{})
	if !b.SetHeld([]string{"y", "x"}) || b.SetHeld([]string{"x", "y"}) || !b.SetHeld(nil) {
		t.Error("SetHeld must report changes of the set only")
	}
}
