package nodecondition

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// The repair condition (agent.repairCondition, of any type but the default GPURebootRequired)
// tells a node repair engine (Karpenter's node repair, EKS node auto repair, Cluster API's
// MachineHealthCheck) that the node must be rebooted or replaced for its GPUs, in a fixed
// vocabulary, and never asks for a repair the circuit breaker holds back (docs/repair-engines.md).

// Repair is what a GPU needs of its node, in increasing order.
type Repair int

// What a GPU can need of its node.
const (
	// RepairNone: nothing, or something a GPU reset, the application or time takes care of.
	RepairNone Repair = iota
	// RepairReboot: a reboot (or power cycle) of the node.
	RepairReboot
	// RepairReplace: hardware work a reboot does not do; for a repair engine, a new node.
	RepairReplace
)

// RepairFor returns what condition c of a whole GPU needs of its node, from gpuhealth's own
// recommended actions: an Unhealthy condition recommending replaceGPU (the fault came back after
// repairs) or checkHardware (a row-remap failure, auxiliary power, a GPU missing from the bus)
// needs the node replaced; one recommending rebootNode (XID 79, a lost GPU, NVML's NODE_REBOOT)
// or recoverIMEXDomain, and remediation giving up on the GPU (RemediationFailed, or
// ValidationFailed with a reboot recommended), need it rebooted. Reset-class faults need nothing
// of the node: gpuhealth's remediation resets the GPU, and asks for a reboot when that fails.
func RepairFor(c health.Condition) Repair {
	unhealthy := c.Severity == health.Unhealthy
	switch {
	case unhealthy && (c.RecommendedAction == health.ActionReplaceGPU || c.RecommendedAction == health.ActionCheckHardware):
		return RepairReplace
	case c.Reason == gpuhealthv1.ReasonRemediationFailed,
		c.Reason == gpuhealthv1.ReasonValidationFailed && c.RecommendedAction == health.ActionRebootNode,
		unhealthy && (c.RecommendedAction == health.ActionRebootNode || c.RecommendedAction == health.ActionRecoverIMEXDomain):
		return RepairReboot
	}
	return RepairNone
}

// RepairVerdict is the repair condition's content, whatever the polarity of its type.
type RepairVerdict struct {
	// Repair says the condition asks for a repair (its repair status).
	Repair          bool
	Reason, Message string
}

// gpuRepair returns what GPU d needs of its node and why (the messages of the conditions that
// need it). A MIG instance needs nothing of its own: its faults are its GPU's.
func gpuRepair(d health.DeviceStatus) (Repair, []string) {
	need, why := RepairNone, []string(nil)
	if d.Device.MIG != nil {
		return need, why
	}
	for _, c := range d.Conditions {
		if r := RepairFor(c); r != RepairNone {
			need = max(need, r)
			why = append(why, cmp.Or(c.Message, c.Reason))
		}
	}
	return need, why
}

// RepairDesired returns the repair condition for snap. held are the GPUs the circuit breaker
// holds back (or could not be asked about): their repairs are not asked for. The reason is
// ReplaceRequired when a GPU not held needs the node replaced, RebootRequired when one needs it
// rebooted, RepairHeldByCircuitBreaker when every GPU that needs a repair is held, else
// NoRepairRequired. The message names each GPU that needs a repair, by index and UUID, and why.
func RepairDesired(snap health.Snapshot, held []string) RepairVerdict {
	var asked, heldBack []string
	worst := RepairNone
	for _, d := range snap.Devices {
		need, why := gpuRepair(d)
		if need == RepairNone {
			continue
		}
		verb := "rebooted"
		if need == RepairReplace {
			verb = "replaced"
		}
		desc := fmt.Sprintf("GPU %d (%s) needs the node %s: %s", d.Device.Index, d.Device.UUID, verb, strings.Join(why, "; "))
		if slices.Contains(held, d.Device.UUID) {
			heldBack = append(heldBack, desc)
			continue
		}
		asked = append(asked, desc)
		worst = max(worst, need)
	}
	heldNote := "the circuit breaker holds back the repair of GPUs that failed in a wave (too many of the cluster's GPUs at once; `gpuhealth breaker ack` lets them through): " +
		strings.Join(heldBack, ". ")
	switch {
	case worst != RepairNone:
		reason := gpuhealthv1.ReasonRebootRequired
		if worst == RepairReplace {
			reason = gpuhealthv1.ReasonReplaceRequired
		}
		msg := strings.Join(asked, ". ")
		if len(heldBack) > 0 {
			msg += ". Besides, " + heldNote
		}
		return RepairVerdict{Repair: true, Reason: reason, Message: msg}
	case len(heldBack) > 0:
		return RepairVerdict{Reason: gpuhealthv1.ReasonRepairHeldByCircuitBreaker, Message: heldNote}
	default:
		return RepairVerdict{Reason: gpuhealthv1.ReasonNoRepairRequired, Message: "no GPU needs the node rebooted or replaced"}
	}
}

// repairHeld returns the GPUs of snap that need a repair the circuit breaker does not let them
// ask for. With an Admitter the syncer asks the breaker itself, once per GPU and fault: a GPU it
// admits (taking a slot of the budget, or finding the one the device-taint reporter took) keeps
// asking for as long as it needs the repair, so that an engine's toleration keeps running, and
// a GPU the breaker could not be asked about is held (its error returned, for a retry). Without
// DRA devices the device-taint reporter asks about no GPU at all, so this is the repair
// condition's only guard. A Breaker that cannot admit leaves the device-taint reporter's word.
// Sync runs one at a time (report.Writer), so admitted needs no lock.
func (s *Syncer) repairHeld(ctx context.Context, snap health.Snapshot) ([]string, error) {
	if s.breaker == nil {
		return nil, nil
	}
	admitter, ok := s.breaker.(Admitter)
	if !ok {
		return s.breaker.Held(), nil
	}
	var held []string
	var errs []error
	needing := map[string]bool{}
	for _, d := range snap.Devices {
		if need, _ := gpuRepair(d); need == RepairNone {
			continue
		}
		uuid := d.Device.UUID
		needing[uuid] = true
		if s.admitted[uuid] {
			continue
		}
		switch ok, err := admitter.Admit(ctx, uuid); {
		case err != nil:
			held = append(held, uuid)
			errs = append(errs, fmt.Errorf("circuit breaker, GPU %s: %w", uuid, err))
		case ok:
			s.admitted[uuid] = true
		default:
			held = append(held, uuid)
		}
	}
	// A GPU that needs no repair any more asks the breaker again for its next one.
	maps.DeleteFunc(s.admitted, func(uuid string, _ bool) bool { return !needing[uuid] })
	return held, errors.Join(errs...)
}

// repairCondition is v as a condition of the configured type and polarity.
func repairCondition(cfg config.RepairConditionConfig, v RepairVerdict) corev1.NodeCondition {
	cfg = cfg.WithDefaults()
	status := cfg.HealthyStatus()
	if v.Repair {
		status = cfg.RepairStatus
	}
	return corev1.NodeCondition{Type: corev1.NodeConditionType(cfg.Type), Status: corev1.ConditionStatus(status), Reason: v.Reason, Message: v.Message}
}
