package remediation

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/kube/kubetest"
)

func TestBudgetAdmitsAtMostMaxAndReleases(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(t0)
	client := kubetest.StampCreation(fake.NewClientset(), "leases", clk)
	a := NewBudget(adapt.Clientset(client), "ops", "n1", 2, 10*time.Minute, clk)
	b := NewBudget(adapt.Clientset(client), "ops", "n2", 2, 10*time.Minute, clk)
	take := func(bud *Budget, uuid string, want bool) {
		t.Helper()
		got, err := bud.TakeSlot(ctx, uuid)
		if err != nil || got != want {
			t.Fatalf("TakeSlot(%s) = %v, %v; want %v", uuid, got, err, want)
		}
	}
	take(a, "GPU-a", true)
	take(a, "GPU-a", true) // held: confirmed, no second slot
	take(b, "GPU-x", true)
	take(b, "GPU-y", false)
	take(a, "GPU-b", false)
	leases, err := client.CoordinationV1().Leases("ops").List(ctx, metav1.ListOptions{})
	if err != nil || len(leases.Items) != 2 {
		t.Fatalf("%d leases (%v), want 2", len(leases.Items), err)
	}
	// The breaker's slots are another budget.
	if slots, err := breaker.ListSlots(ctx, adapt.Clientset(client), "ops"); err != nil || len(slots) != 0 {
		t.Fatalf("remediation slots count as the breaker's: %v %v", slots, err)
	}
	if err := a.ReleaseSlot(ctx, "GPU-a"); err != nil {
		t.Fatal(err)
	}
	take(b, "GPU-y", true)
	if err := a.ReleaseSlot(ctx, "GPU-never-held"); err != nil {
		t.Fatal(err)
	}
}

func TestBudgetSlotOfADeadAgentExpires(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(t0)
	client := kubetest.StampCreation(fake.NewClientset(), "leases", clk)
	dead := NewBudget(adapt.Clientset(client), "ops", "n1", 1, 5*time.Minute, clk)
	other := NewBudget(adapt.Clientset(client), "ops", "n2", 1, 5*time.Minute, clk)
	if ok, err := dead.TakeSlot(ctx, "GPU-a"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	clk.Step(5*time.Minute - time.Second)
	if ok, _ := other.TakeSlot(ctx, "GPU-b"); ok {
		t.Fatal("took a live slot")
	}
	clk.Step(time.Second)
	// Expired, but another node's: only the breaker controller's Sweeper deletes it.
	if ok, _ := other.TakeSlot(ctx, "GPU-b"); ok {
		t.Fatal("took another node's expired slot before it was swept")
	}
	sweeper := &breaker.Sweeper{Pools: []breaker.SweptPool{breaker.ExpiringPool(SlotPool(adapt.Clientset(client), "ops"))}}
	if _, err := sweeper.Sweep(ctx, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if ok, err := other.TakeSlot(ctx, "GPU-b"); !ok || err != nil {
		t.Fatalf("swept slot not taken: %v %v", ok, err)
	}
	// The dead agent's late release must not free the slot someone else took over.
	if err := dead.ReleaseSlot(ctx, "GPU-a"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := dead.TakeSlot(ctx, "GPU-c"); ok {
		t.Fatal("the slot taken over was released by its old holder")
	}
}

// TestBudgetRetakesItsOwnExpiredSlot: an agent that restarts after its repair's slot expired
// deletes its own slot and takes it again (agents may delete only their own node's slots).
func TestBudgetRetakesItsOwnExpiredSlot(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(t0)
	client := kubetest.StampCreation(fake.NewClientset(), "leases", clk)
	b := NewBudget(adapt.Clientset(client), "ops", "n1", 1, 5*time.Minute, clk)
	if ok, err := b.TakeSlot(ctx, "GPU-a"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	clk.Step(6 * time.Minute)
	if ok, err := b.TakeSlot(ctx, "GPU-b"); !ok || err != nil {
		t.Fatalf("own expired slot not taken again: %v %v", ok, err)
	}
	slots, err := SlotPool(adapt.Clientset(client), "ops").List(ctx)
	if err != nil || len(slots) != 1 || slots[0].UUID != "GPU-b" || !slots[0].At.Equal(clk.Now()) {
		t.Fatalf("slots %+v, %v; want GPU-b's, created now", slots, err)
	}
}
