package nvsentinel

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
)

// What every event says of its sender, as NVSentinel's rules and clearing keys read it.
const (
	// Agent is the agent field: fault-quarantine's rules select on it, and its clearing keys
	// include it, so gpuhealth never sends under another monitor's name.
	Agent          = "gpuhealth"
	ComponentClass = "GPU"
	// Version is the event's and the batch's version; it is part of the clearing key.
	Version = 1
)

// Entity types NVSentinel's GPU monitors use.
const (
	EntityGPU     = "GPU"
	EntityPCI     = "PCI"
	EntityGPUUUID = "GPU_UUID"
)

// Metadata keys gpuhealth sets on its events, for people and for rules that want the detail.
const (
	MetaCondition = "gpuhealth.dev/condition"
	MetaReason    = "gpuhealth.dev/reason"
	// MetaMIG names the MIG instance a fault was seen on (the event names its GPU).
	MetaMIG = "gpuhealth.dev/mig"
	// MetaRepairedBy is "gpuhealth" on the events of a GPU gpuhealth is repairing itself.
	MetaRepairedBy = "gpuhealth.dev/repairedBy"
)

// Key identifies one fault as NVSentinel keeps it: a GPU (its UUID), a check and an error code.
// A key with no code stands for every code of the GPU's check, and one with no GPU for the whole
// check (the clears at start).
type Key struct {
	GPU, Check, Code string
}

func (k Key) String() string { return k.GPU + "/" + k.Check + "/" + k.Code }

func compareKeys(a, b Key) int {
	return strings.Compare(a.String(), b.String())
}

// MapOptions say how a snapshot becomes events.
type MapOptions struct {
	// NodeName is the event's nodeName: the Node NVSentinel writes its condition on.
	NodeName string
	// RebootAction is what a reboot-class fault asks for: RESTART_BM (the default) or
	// RESTART_VM.
	RebootAction datamodels.RecommendedAction
	// Repairing, when set, reports whether the embedder's own remediation is repairing this
	// physical GPU. The GPU's fatal events then ask NVSentinel for nothing: recommendedAction
	// NONE (fault-remediation skips such an event) and drainOverrides.skip (node-drainer leaves
	// the node's pods alone); docs/nvsentinel.md says why these two.
	Repairing func(health.DeviceStatus) bool
	// Checks maps condition types of the embedder's own to a checkName (the agent's
	// Remediation condition to CheckRepair); they take precedence over the built-in table.
	Checks map[health.ConditionType]string
}

func (o MapOptions) rebootAction() datamodels.RecommendedAction {
	if o.RebootAction == datamodels.RecommendedAction_RESTART_VM {
		return o.RebootAction
	}
	return datamodels.RecommendedAction_RESTART_BM
}

// Fault is one unhealthy event gpuhealth wants NVSentinel to hold.
type Fault struct {
	Key   Key
	Event *datamodels.HealthEvent
}

// GPU is a physical GPU as events name it.
type GPU struct {
	UUID string
	// Entities are the same on every event of the GPU: GPU (the index), PCI (domain:bus:device,
	// the function stripped, as NVSentinel writes it) and GPU_UUID, each where known.
	Entities []*datamodels.Entity
	status   health.DeviceStatus
}

// GPUs returns the physical GPUs of snap, by UUID. A missing GPU's placeholder is one: its
// made-up UUID names it, so that its fault and the fault's end name the same entities.
func GPUs(snap health.Snapshot) map[string]GPU {
	out := map[string]GPU{}
	for _, d := range snap.Devices {
		if d.Device.MIG == nil {
			out[d.Device.UUID] = GPU{UUID: d.Device.UUID, Entities: Entities(d.Device), status: d}
		}
	}
	return out
}

// Entities returns the entities of a physical GPU's events.
func Entities(d health.Device) []*datamodels.Entity {
	var out []*datamodels.Entity
	if d.Index >= 0 && !d.Missing {
		out = append(out, &datamodels.Entity{EntityType: EntityGPU, EntityValue: strconv.Itoa(d.Index)})
	}
	if addr, err := health.NormalizePCIBusID(d.PCIBusID); err == nil {
		out = append(out, &datamodels.Entity{EntityType: EntityPCI, EntityValue: addr[:strings.LastIndexByte(addr, '.')]})
	}
	if d.UUID != "" {
		out = append(out, &datamodels.Entity{EntityType: EntityGPUUUID, EntityValue: d.UUID})
	}
	return out
}

// Faults returns the unhealthy events for snap, sorted by key: one per physical GPU, check and
// error code, from the conditions of the GPU and of its MIG instances (a MIG instance's fault
// names its GPU, since NVSentinel has no MIG entity). Conditions that share a key merge into the
// worst, the earliest among equals. Unhealthy is fatal; Degraded is not, and asks for nothing.
func Faults(snap health.Snapshot, o MapOptions) []Fault {
	gpus := GPUs(snap)
	type candidate struct {
		c   health.Condition
		mig *health.Device
	}
	worst := map[Key]candidate{}
	// The GPUs first: a MIG instance repeats its GPU's conditions, which are the GPU's own.
	devices := slices.Clone(snap.Devices)
	slices.SortStableFunc(devices, func(a, b health.DeviceStatus) int {
		return cmp.Compare(boolInt(a.Device.MIG != nil), boolInt(b.Device.MIG != nil))
	})
	for _, d := range devices {
		parent := d.Device.UUID
		var mig *health.Device
		if d.Device.MIG != nil {
			parent, mig = d.Device.MIG.ParentUUID, &d.Device
		}
		if _, ok := gpus[parent]; !ok {
			continue // a MIG instance whose GPU the snapshot lacks: nothing to name
		}
		for _, c := range d.Conditions {
			check, ok := CheckName(c.Type, o.Checks)
			if !ok || c.Severity == health.Healthy {
				continue
			}
			k := Key{GPU: parent, Check: check, Code: ErrorCode(c)}
			if old, ok := worst[k]; ok && (old.c.Severity > c.Severity || (old.c.Severity == c.Severity && !c.Since.Before(old.c.Since))) {
				continue
			}
			worst[k] = candidate{c: c, mig: mig}
		}
	}
	out := make([]Fault, 0, len(worst))
	for k, w := range worst {
		gpu := gpus[k.GPU]
		repairing := o.Repairing != nil && o.Repairing(gpu.status)
		out = append(out, Fault{Key: k, Event: faultEvent(k, w.c, w.mig, gpu, repairing, o)})
	}
	slices.SortFunc(out, func(a, b Fault) int { return compareKeys(a.Key, b.Key) })
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// faultEvent is the unhealthy event of condition c (seen on mig, or on the GPU itself when nil).
func faultEvent(k Key, c health.Condition, mig *health.Device, gpu GPU, repairing bool, o MapOptions) *datamodels.HealthEvent {
	fatal := c.Severity == health.Unhealthy
	ev := newEvent(o.NodeName, k.Check, gpu.Entities, k.Code)
	ev.IsFatal = fatal
	ev.Metadata = map[string]string{MetaCondition: string(c.Type), MetaReason: c.Reason}
	what := fmt.Sprintf("GPU %d (%s)", gpu.status.Device.Index, gpu.UUID)
	switch {
	case gpu.status.Device.Missing:
		what = "missing GPU " + gpu.UUID
	case mig != nil:
		what = fmt.Sprintf("MIG instance %s of GPU %d (GI %d, CI %d)", mig.UUID, gpu.status.Device.Index, mig.MIG.GPUInstance, mig.MIG.ComputeInstance)
		ev.Metadata[MetaMIG] = mig.UUID
	}
	// The same text for the same fault before and after an agent restart: NVSentinel keeps one
	// entry per distinct text in its Node condition's message.
	ev.Message = fmt.Sprintf("%s %s: %s: %s", what, c.Severity, c.Reason, strings.TrimSuffix(c.Message, health.RestoredFromReportNote))
	switch {
	case !fatal:
		// NVSentinel's monitors never send a non-fatal event with an action: Degraded asks for
		// nothing, as in gpuhealth.
		ev.RecommendedAction = datamodels.RecommendedAction_NONE
	case repairing:
		ev.RecommendedAction = datamodels.RecommendedAction_NONE
		ev.DrainOverrides = &datamodels.BehaviourOverrides{Skip: true}
		ev.Metadata[MetaRepairedBy] = Agent
		ev.Message += "; gpuhealth is repairing this GPU itself"
	default:
		realUUID := !gpu.status.Device.Missing
		ev.RecommendedAction = Action(c.RecommendedAction, realUUID, o.rebootAction())
	}
	return ev
}

// newEvent returns an event of gpuhealth's with the fields every event shares; code is left
// out when empty.
func newEvent(node, check string, entities []*datamodels.Entity, code string) *datamodels.HealthEvent {
	ev := &datamodels.HealthEvent{
		Version: Version, Agent: Agent, ComponentClass: ComponentClass, CheckName: check, NodeName: node,
		EntitiesImpacted:   entities,
		ProcessingStrategy: datamodels.ProcessingStrategy_EXECUTE_REMEDIATION,
	}
	if code != "" {
		ev.ErrorCode = []string{code}
	}
	return ev
}

// Twin returns the healthy event that ends fault: the same check, error codes and entities
// (NVSentinel clears by them: both its Node condition and its quarantine bookkeeping keep one
// entry per entity and code, so a twin that names fewer leaves the node quarantined), healthy,
// not fatal, asking for nothing.
func Twin(fault *datamodels.HealthEvent) *datamodels.HealthEvent {
	ev := newEvent(fault.NodeName, fault.CheckName, fault.EntitiesImpacted, "")
	ev.ErrorCode = slices.Clone(fault.ErrorCode)
	ev.IsHealthy = true
	ev.Message = "no longer in effect: " + fault.Message
	ev.Metadata = map[string]string{MetaCondition: fault.Metadata[MetaCondition], MetaReason: fault.Metadata[MetaReason]}
	return ev
}

// ReasonAgentStarted is the reason of the clears a publisher sends once at start.
const ReasonAgentStarted = "AgentStarted"

// clearEvent returns the healthy event with no error code that ends every fault of check on the
// GPU with entities, or, with no entities, on every GPU of the node: what gpuhealth sends at start
// for what it does not find faulty (a fault that ended while it was not running, a reboot).
func clearEvent(node, check string, entities []*datamodels.Entity) *datamodels.HealthEvent {
	ev := newEvent(node, check, entities, "")
	ev.IsHealthy = true
	ev.Message = "gpuhealth started and finds no " + check + " fault"
	ev.Metadata = map[string]string{MetaReason: ReasonAgentStarted}
	return ev
}
