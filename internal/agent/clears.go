package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// clearRequests is the kind of requests `gpuhealth clear` writes on the Node
// (gpuhealthv1.ClearsKey): operators' requests to clear false positives. Each is applied once,
// through the monitor, and named in an Event (who, why, what was cleared, or a Warning that
// nothing was); the annotation is then removed as for every kind (requestWatcher), so a
// condition that returns is raised again as any other.
func clearRequests(monitor *health.Monitor, clk clock.PassiveClock, recorder record.EventRecorder, nodeRef *corev1.ObjectReference) requestKind {
	// apply clears what one request names and says so in an Event.
	apply := func(ctx context.Context, uuid string, c gpuhealthv1.Clear) {
		logger := klog.FromContext(ctx)
		sel, _ := gpuhealthv1.ParseConditionSelector(c.Condition) // ParseClears checked it
		res := clearConditions(monitor, uuid, sel, c.At, clk.Now())
		what := sel.String()
		if what == "" {
			what = "every condition"
		}
		switch {
		case !res.found:
			logger.Info("A clear request names a GPU this node does not have", "gpu", uuid, "condition", what, "by", c.By)
			recorder.Eventf(nodeRef, corev1.EventTypeWarning, gpuhealthv1.EventClearMatchedNothing,
				"gpuhealth cleared nothing: this node has no GPU %s (request for %s %s)", uuid, what, c.Message())
		case len(res.cleared) == 0:
			logger.Info("A clear request matched no condition", "gpu", uuid, "condition", what, "by", c.By, "inEffect", res.remaining, "raisedAfter", res.later)
			recorder.Eventf(nodeRef, corev1.EventTypeWarning, gpuhealthv1.EventClearMatchedNothing,
				"gpuhealth cleared nothing on %s: %s; requested %s", res.device, res.nothingMatched(sel), c.Message())
		default:
			logger.Info("Cleared conditions at an operator's request", "gpu", uuid, "cleared", res.cleared, "by", c.By, "reason", c.Reason)
			recorder.Eventf(nodeRef, corev1.EventTypeNormal, gpuhealthv1.EventConditionsCleared,
				"gpuhealth cleared %s on %s, requested %s; %s%s", strings.Join(res.cleared, ", "), res.device, c.Message(), res.now(), res.laterNote())
		}
	}
	return requestKind{
		key: gpuhealthv1.ClearsKey, name: "clear", malformedReason: gpuhealthv1.EventMalformedClears, notRemovedReason: gpuhealthv1.EventClearsNotRemoved,
		pending: func(value string) ([]pendingRequest, error) {
			clears, err := gpuhealthv1.ParseClears(value)
			if err != nil {
				return nil, err
			}
			var out []pendingRequest
			for _, uuid := range slices.Sorted(maps.Keys(clears)) {
				for _, c := range clears[uuid] {
					out = append(out, pendingRequest{id: requestKey(uuid, c), at: c.At, apply: func(ctx context.Context) { apply(ctx, uuid, c) }})
				}
			}
			return out, nil
		},
	}
}

// requestKey identifies a request of the GPU uuid while it is on the Node.
func requestKey(uuid string, r any) string {
	b, _ := json.Marshal(r) // requests are structs of strings, ints and times: never fails
	return uuid + "\x00" + string(b)
}

// ClearsRemovalPatch is the JSON patch the agent sends to remove the clear requests it applied:
// it removes gpuhealth.dev/gpu-clears only while the annotation still holds value, so a request
// written since the Node was read stays.
func ClearsRemovalPatch(value string) ([]byte, error) {
	return removalPatch(gpuhealthv1.ClearsKey, value)
}

// clearResult is what clearConditions did.
type clearResult struct {
	found bool
	// device names the GPU: "GPU 1 (GPU-...)".
	device string
	// cleared are the reasons of the conditions it ended; remaining those in effect after it;
	// later those it selected but left, because they began after the request was written.
	cleared, remaining, later []string
	health                    health.Severity
	at                        time.Time
}

// laterNote says which selected conditions were left because they began after the request.
func (r clearResult) laterNote() string {
	if len(r.later) == 0 {
		return ""
	}
	return fmt.Sprintf("; left %s: raised after the request was written (%s), a request clears only what it saw",
		strings.Join(r.later, ", "), r.at.UTC().Format(time.RFC3339))
}

func (r clearResult) nothingMatched(sel gpuhealthv1.ConditionSelector) string {
	if len(r.later) > 0 {
		return fmt.Sprintf("%s raised after the request was written (%s), and a request clears only what was in effect then",
			strings.Join(r.later, ", "), r.at.UTC().Format(time.RFC3339))
	}
	msg := "no condition " + sel.String() + " in effect"
	if sel.Name == "" {
		msg = "no condition to clear in effect"
	}
	if len(r.remaining) > 0 {
		msg += " (in effect: " + strings.Join(r.remaining, ", ") + ")"
	}
	if slices.Contains(r.remaining, health.ReasonAdminDrain) {
		msg += "; gpuhealth undrain ends a drain"
	}
	return msg
}

func (r clearResult) now() string {
	if len(r.remaining) == 0 {
		return "now " + r.health.String()
	}
	return "now " + r.health.String() + ", still " + strings.Join(r.remaining, ", ")
}

// clearConditions ends the conditions sel selects on the GPU uuid and on its MIG instances that
// began at or before at (when the request was written, to the second), through the Monitor, which publishes
// each change with its transitions (reporters, the checkpoint, the GPURecovered Event and the
// transition metric follow). A selected condition that began after at is left and named.
func clearConditions(m *health.Monitor, uuid string, sel gpuhealthv1.ConditionSelector, at, now time.Time) clearResult {
	tracker := m.Tracker()
	snap := tracker.Snapshot()
	gpu := findDevice(snap, uuid)
	if gpu == nil {
		return clearResult{}
	}
	res := clearResult{found: true, device: fmt.Sprintf("GPU %d (%s)", gpu.Device.Index, gpu.Device.UUID), at: at}
	if gpu.Device.MIG != nil {
		res.device = "MIG instance " + gpu.Device.UUID
	}
	type target struct {
		uuid   string
		typ    health.ConditionType
		code   uint32
		reason string
	}
	var targets []target
	for _, d := range snap.Devices {
		if d.Device.UUID != gpu.Device.UUID && (gpu.Device.MIG != nil || d.Device.MIG == nil || d.Device.MIG.ParentUUID != gpu.Device.UUID) {
			continue
		}
		for _, c := range d.Conditions {
			switch {
			case !sel.Matches(c):
			case c.Since.Truncate(time.Second).After(at): // at has whole seconds: a condition of its second was seen
				if !slices.Contains(res.later, c.Reason) {
					res.later = append(res.later, c.Reason)
				}
			default:
				targets = append(targets, target{d.Device.UUID, c.Type, c.Code, c.Reason})
			}
		}
	}
	for _, tg := range targets {
		if changed, err := m.ClearCondition(tg.uuid, tg.typ, tg.code, now); err == nil && changed && !slices.Contains(res.cleared, tg.reason) {
			res.cleared = append(res.cleared, tg.reason)
		}
	}
	after := findDevice(tracker.Snapshot(), gpu.Device.UUID)
	res.health = after.Health
	for _, c := range health.WorstFirst(after.Conditions) {
		if !slices.Contains(res.remaining, c.Reason) {
			res.remaining = append(res.remaining, c.Reason)
		}
	}
	return res
}

// findDevice returns the device of snap with uuid, compared exactly first and then without
// regard to case (a UUID typed by hand).
func findDevice(snap health.Snapshot, uuid string) *health.DeviceStatus {
	for i := range snap.Devices {
		if snap.Devices[i].Device.UUID == uuid {
			return &snap.Devices[i]
		}
	}
	for i := range snap.Devices {
		if strings.EqualFold(snap.Devices[i].Device.UUID, uuid) {
			return &snap.Devices[i]
		}
	}
	return nil
}
