package deviceapi

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/v1alpha1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Condition statuses, as Kubernetes writes them.
const (
	StatusTrue    = "True"
	StatusFalse   = "False"
	StatusUnknown = "Unknown"
)

// Reasons of the conditions that no gpuhealth condition explains. Any other reason is the
// reason of a gpuhealth condition ("XID79", "UncorrectedECCErrors", "AdminDrain", ...).
const (
	// ReasonHealthy: no fault in effect.
	ReasonHealthy = "Healthy"
	// ReasonNotMonitored: the backend cannot run any check of the family on this GPU.
	ReasonNotMonitored = "NotMonitored"
)

// maxAlso bounds how many further reasons a condition's message names after the worst one.
const maxAlso = 8

// Name returns the name of the Gpu of the GPU with this UUID: the UUID in lowercase, as the
// Device API's own examples name GPUs.
func Name(uuid string) string { return strings.ToLower(uuid) }

// Convert returns one Gpu per physical GPU of snap, in the snapshot's order: a MIG instance is
// no Gpu of its own (the Device API's spec.uuid is a GPU's), and its own conditions count for
// its GPU. prev holds the previous conversion's Gpus by name (nil at first): a condition whose
// status did not change keeps its last_transition_time; one that changed to False takes the
// time its earliest fault began, one that changed to True or Unknown takes now. Convert is
// pure: the same input gives the same Gpus.
func Convert(snap health.Snapshot, prev map[string]*v1alpha1.Gpu, now time.Time) []*v1alpha1.Gpu {
	gpus := physicalGPUs(snap)
	out := make([]*v1alpha1.Gpu, 0, len(gpus))
	for _, g := range gpus {
		out = append(out, g.convert(prev[Name(g.status.Device.UUID)], now))
	}
	return out
}

// sourced is a condition and the MIG instance it was seen on (nil: the GPU itself).
type sourced struct {
	health.Condition
	mig *health.Device
}

// physicalGPU is a GPU and every condition that counts for it.
type physicalGPU struct {
	status health.DeviceStatus
	conds  []sourced
}

// physicalGPUs gathers the GPUs of snap in order, each with its own conditions and those its MIG
// instances have of their own (a MIG instance's status repeats its GPU's conditions: those are
// counted once, as the GPU's).
func physicalGPUs(snap health.Snapshot) []*physicalGPU {
	var out []*physicalGPU
	byUUID := map[string]*physicalGPU{}
	for _, d := range snap.Devices {
		if d.Device.MIG != nil {
			continue
		}
		g := &physicalGPU{status: d}
		for _, c := range d.Conditions {
			g.conds = append(g.conds, sourced{Condition: c})
		}
		out = append(out, g)
		byUUID[d.Device.UUID] = g
	}
	for _, d := range snap.Devices {
		if d.Device.MIG == nil {
			continue
		}
		g, ok := byUUID[d.Device.MIG.ParentUUID]
		if !ok {
			continue // a MIG instance whose GPU the snapshot lacks: nothing to count it for
		}
		for _, c := range d.Conditions {
			inherited := slices.ContainsFunc(g.status.Conditions, func(p health.Condition) bool { return p.Type == c.Type && p.Code == c.Code })
			if !inherited {
				g.conds = append(g.conds, sourced{Condition: c, mig: &d.Device})
			}
		}
	}
	return out
}

// verdict is a condition before its time is set, and, when False, when its faults began.
type verdict struct {
	cond  *v1alpha1.Condition
	since time.Time
}

func (g *physicalGPU) convert(prev *v1alpha1.Gpu, now time.Time) *v1alpha1.Gpu {
	faults := worstFirst(g.conds)
	verdicts := []verdict{ready(faults, g.status.Unmonitored)}
	for _, fam := range FamilyTypes() {
		verdicts = append(verdicts, g.family(fam, faults))
	}
	conds := make([]*v1alpha1.Condition, len(verdicts))
	for i, v := range verdicts {
		conds[i] = v.stamped(previous(prev, v.cond.GetType()), now)
	}
	return &v1alpha1.Gpu{
		Name:   Name(g.status.Device.UUID),
		Spec:   &v1alpha1.GpuSpec{Uuid: g.status.Device.UUID},
		Status: &v1alpha1.GpuStatus{Conditions: conds, RecommendedAction: recommendedAction(faults)},
	}
}

// worstFirst returns the faults among conds (a condition of severity Healthy is none), most
// severe first, earliest first among equals.
func worstFirst(conds []sourced) []sourced {
	out := slices.DeleteFunc(slices.Clone(conds), func(c sourced) bool { return c.Severity == health.Healthy })
	slices.SortStableFunc(out, func(a, b sourced) int {
		if a.Severity != b.Severity {
			return int(b.Severity) - int(a.Severity)
		}
		return a.Since.Compare(b.Since)
	})
	return out
}

// ready is gpuhealth's verdict: False while the GPU (or one of its MIG instances) is Unhealthy,
// True otherwise. A Degraded GPU stays Ready, as schedulers keep placing work on it, with the
// reason of its worst condition.
func ready(faults []sourced, unmonitored bool) verdict {
	if len(faults) == 0 {
		msg := "no fault in effect"
		if unmonitored {
			msg += "; the backend cannot watch this GPU's events, so XIDs go unseen"
		}
		return verdict{cond: &v1alpha1.Condition{Type: TypeReady, Status: StatusTrue, Reason: ReasonHealthy, Message: msg}}
	}
	status := StatusTrue
	if faults[0].Severity == health.Unhealthy {
		status = StatusFalse
	}
	return verdict{cond: &v1alpha1.Condition{Type: TypeReady, Status: status, Reason: faults[0].Reason, Message: describe(faults)}, since: earliest(faults, health.Unhealthy)}
}

// family is the condition of one family: False while a fault of the family is in effect,
// Unknown when the backend runs none of its checks, True otherwise.
func (g *physicalGPU) family(fam string, faults []sourced) verdict {
	mine := slices.DeleteFunc(slices.Clone(faults), func(c sourced) bool {
		f, ok := Family(c.Type)
		return !ok || f != fam
	})
	if len(mine) > 0 {
		return verdict{cond: &v1alpha1.Condition{Type: fam, Status: StatusFalse, Reason: mine[0].Reason, Message: describe(mine)}, since: earliest(mine, health.Degraded)}
	}
	cond := &v1alpha1.Condition{Type: fam, Status: StatusTrue, Reason: ReasonHealthy, Message: "no fault in effect"}
	if fam == TypeXID && g.status.Unmonitored {
		cond.Status, cond.Reason, cond.Message = StatusUnknown, ReasonNotMonitored, "the backend cannot watch this GPU's events"
	}
	var off []string
	for _, c := range checksOf[fam] {
		if slices.Contains(g.status.UnmonitoredChecks, c) {
			off = append(off, string(c))
		}
	}
	switch {
	case len(off) == 0:
	case len(off) == len(checksOf[fam]):
		cond.Status, cond.Reason, cond.Message = StatusUnknown, ReasonNotMonitored, "the backend cannot run these checks on this GPU: "+strings.Join(off, ", ")
	default:
		cond.Message += "; not monitored: " + strings.Join(off, ", ")
	}
	return verdict{cond: cond}
}

// describe says what the worst fault is and names the reasons of the others.
func describe(faults []sourced) string {
	w := faults[0]
	msg := w.Severity.String() + ": "
	if w.mig != nil {
		msg += fmt.Sprintf("MIG instance %s (GPU instance %d, compute instance %d): ", w.mig.UUID, w.mig.MIG.GPUInstance, w.mig.MIG.ComputeInstance)
	}
	msg += w.Message
	var also []string
	for _, f := range faults[1:] {
		if !slices.Contains(also, f.Reason) && f.Reason != w.Reason {
			also = append(also, f.Reason)
		}
	}
	if len(also) > maxAlso {
		also = append(also[:maxAlso], fmt.Sprintf("%d more", len(also)-maxAlso))
	}
	if len(also) > 0 {
		msg += "; also " + strings.Join(also, ", ")
	}
	return msg
}

// earliest is when the earliest fault of at least severity min began.
func earliest(faults []sourced, min health.Severity) time.Time {
	var t time.Time
	for _, f := range faults {
		if f.Severity >= min && (t.IsZero() || f.Since.Before(t)) {
			t = f.Since
		}
	}
	return t
}

// recommendedAction is the action of the worst fault that recommends one, in UpperCamelCase
// ("resetGPU" becomes "ResetGPU", as the Device API's own examples write actions); empty
// when no fault asks for anything.
func recommendedAction(faults []sourced) string {
	for _, f := range faults {
		if a := f.RecommendedAction; a != "" && a != health.ActionNone {
			r, size := utf8.DecodeRuneInString(string(a))
			return string(unicode.ToUpper(r)) + string(a)[size:]
		}
	}
	return ""
}

// previous returns prev's condition of type typ, nil when there is none.
func previous(prev *v1alpha1.Gpu, typ string) *v1alpha1.Condition {
	for _, c := range prev.GetStatus().GetConditions() {
		if c.GetType() == typ {
			return c
		}
	}
	return nil
}

// stamped sets the condition's last_transition_time: prev's when the status did not change,
// else when the faults began (False) or now.
func (v verdict) stamped(prev *v1alpha1.Condition, now time.Time) *v1alpha1.Condition {
	switch {
	case prev != nil && prev.GetStatus() == v.cond.Status && prev.GetLastTransitionTime() != nil:
		v.cond.LastTransitionTime = prev.GetLastTransitionTime()
	case v.cond.Status == StatusFalse && !v.since.IsZero():
		v.cond.LastTransitionTime = timestamppb.New(v.since)
	default:
		v.cond.LastTransitionTime = timestamppb.New(now)
	}
	return v.cond
}
