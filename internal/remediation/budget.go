package remediation

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// The remediation slots: the circuit breaker's kind of Lease slot, under their own name and
// label, so that repairs never use up the breaker's budget (or the reverse).
const (
	SlotPrefix = "gpuhealth-remediation-slot-"
	SlotLabel  = "gpuhealth.dev/remediation-slot"
)

// Budget lets at most Max GPUs of the cluster be in remediation (reset or probation) at once.
// A slot is held from the reset until probation ends and is then deleted; it also carries a
// duration (the longest a repair can hold it: reset timeout plus probation, plus a margin,
// counted from the slot's creation by the API server's clock), so the slot of an agent that
// died mid-repair stops counting; the breaker controller's Sweeper then deletes it.
type Budget struct {
	pool  breaker.SlotPool
	node  string
	max   int
	hold  time.Duration
	clock clock.PassiveClock
}

// NewBudget returns the budget of the agent on node.
func NewBudget(client kube.Interface, namespace, node string, maxConcurrent int, hold time.Duration, clk clock.PassiveClock) *Budget {
	return &Budget{
		pool: SlotPool(client, namespace),
		node: node, max: maxConcurrent, hold: hold, clock: clk,
	}
}

// SlotPool is the remediation slot pool in namespace: the agents release their own slots.
func SlotPool(client kube.Interface, namespace string) breaker.SlotPool {
	return breaker.SlotPool{Client: client, Namespace: namespace, Prefix: SlotPrefix, Label: SlotLabel, FieldManager: "gpuhealth-agent", OwnerReleases: true}
}

// SlotName is the name of remediation slot k.
func SlotName(k int) string { return SlotPrefix + strconv.Itoa(k) }

var errSlotsBusy = errors.New("remediation budget: lost every race for a free slot; retrying")

// TakeSlot takes a free slot for the GPU, or confirms the one it holds.
func (b *Budget) TakeSlot(ctx context.Context, uuid string) (bool, error) {
	for range 5 {
		now := b.clock.Now()
		slots, err := b.pool.List(ctx)
		if err != nil {
			return false, err
		}
		live := 0
		taken := map[int]breaker.Slot{}
		for _, s := range slots {
			taken[s.Index] = s
			if !s.Expires.After(now) {
				continue
			}
			if s.Node == b.node && s.UUID == uuid {
				return true, nil
			}
			live++
		}
		if live >= b.max {
			return false, nil
		}
		// An expired slot is free if it is this node's (Take deletes it first); another node's
		// waits for the breaker controller's Sweeper.
		var free []int
		for k := range b.max {
			if s, ok := taken[k]; !ok || (!s.Expires.After(now) && s.Node == b.node) {
				free = append(free, k)
			}
		}
		if len(free) == 0 {
			return false, nil
		}
		rand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
		for _, k := range free[:min(len(free), 3)] {
			ok, err := b.pool.Take(ctx, k, taken, breaker.SlotClaim{Node: b.node, UUID: uuid, At: now, Duration: b.hold})
			if err != nil || ok {
				return ok, err
			}
		}
	}
	return false, errSlotsBusy
}

// ReleaseSlot deletes the slots the GPU holds.
func (b *Budget) ReleaseSlot(ctx context.Context, uuid string) error {
	slots, err := b.pool.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range slots {
		if s.Node == b.node && s.UUID == uuid {
			errs = append(errs, b.pool.Release(ctx, s))
		}
	}
	return errors.Join(errs...)
}
