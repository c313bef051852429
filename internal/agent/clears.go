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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Retrying an acknowledgement the API server refused: from a second, doubling, to five minutes.
const (
	clearRetryFirst = time.Second
	clearRetryMax   = 5 * time.Minute
)

// clearWatcher applies operators' requests to clear false positives (the gpu-clears annotation
// written by `gpuhealth clear`) on this agent's Node. Each request is applied once, through the
// monitor, and named in an Event (who, why, what was cleared, or a Warning that nothing was);
// then the annotation is removed, but only if it still holds exactly what was applied (a JSON
// patch that tests the value), so a request added meanwhile is never lost. Once removed, a
// restart cannot apply a request again, and a condition that returns is raised again as any
// other. A malformed annotation is reported and left alone: nothing is applied from it, and
// nothing in it is lost.
//
// An agent that dies between applying and removing applies the requests again when it starts:
// clearing is idempotent, and the window is one API call.
type clearWatcher struct {
	nodes    *nodecache.Cache
	client   kube.Interface
	monitor  *health.Monitor
	clock    clock.Clock
	recorder record.EventRecorder
	nodeRef  *corev1.ObjectReference

	// applied holds the requests of the annotation that are applied and not yet removed: a
	// removal that failed is tried again without applying them again.
	applied map[string]bool
	// malformed and refused are the last values reported in a Warning, so that every update
	// of the Node does not repeat it.
	malformed, refused string
}

// run follows the Node until ctx is done. Only its goroutine touches the watcher's state.
func (w *clearWatcher) run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("watcher", "clears")
	ctx = klog.NewContext(ctx, logger)
	// The informer's handler only pokes: applying and acknowledging happen on this goroutine,
	// from the newest Node the cache knows, never on the informer's.
	poke := make(chan struct{}, 1)
	notify := func(obj any) {
		if node, ok := obj.(*corev1.Node); ok {
			if _, ok := node.Annotations[gpuhealthv1.ClearsKey]; !ok {
				return
			}
		}
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	if err := w.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, obj any) { notify(obj) },
	}); err != nil {
		return err
	}
	if err := w.nodes.Start(ctx); err != nil {
		return err
	}
	var (
		retry <-chan time.Time
		delay time.Duration
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-poke:
		case <-retry:
		}
		retry = nil
		if err := w.sync(ctx); err != nil {
			delay = min(max(2*delay, clearRetryFirst), clearRetryMax)
			if apierrors.IsInvalid(err) {
				// The removal's test failed: someone changed the requests since the Node was read.
				logger.V(2).Info("Clear requests changed meanwhile; reading them again", "in", delay)
			} else {
				logger.Error(err, "Removing the applied clear requests failed; trying again", "in", delay)
			}
			retry = w.clock.After(delay)
			continue
		}
		delay = 0
	}
}

// sync applies the requests on the Node that are not applied yet and removes the annotation.
func (w *clearWatcher) sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	node, err := w.nodes.Get(ctx)
	if err != nil {
		return err
	}
	value, present := node.Annotations[gpuhealthv1.ClearsKey]
	if !present {
		w.applied = nil
		return nil
	}
	clears, err := gpuhealthv1.ParseClears(value)
	if err != nil {
		if value != w.malformed {
			w.malformed = value
			logger.Error(err, "Ignoring a malformed clears annotation; nothing applied, nothing removed")
			w.recorder.Eventf(w.nodeRef, corev1.EventTypeWarning, gpuhealthv1.EventMalformedClears,
				"gpuhealth applied none of the clear requests and left them on the Node: %v", err)
		}
		return nil
	}
	w.malformed = ""
	pending := map[string]bool{}
	for _, uuid := range slices.Sorted(maps.Keys(clears)) {
		for _, c := range clears[uuid] {
			key := requestKey(uuid, c)
			pending[key] = true
			if !w.applied[key] {
				w.apply(ctx, uuid, c)
			}
		}
	}
	w.applied = pending
	return w.remove(ctx, value)
}

// requestKey identifies a request while it is on the Node.
func requestKey(uuid string, c gpuhealthv1.Clear) string {
	b, _ := json.Marshal(c) // a struct of strings, an int and a time: never fails
	return uuid + "\x00" + string(b)
}

// ClearsRemovalPatch is the JSON patch the agent sends to remove the clear requests it applied:
// it removes gpuhealth.dev/gpu-clears only while the annotation still holds value, so a request
// written since the Node was read stays.
func ClearsRemovalPatch(value string) ([]byte, error) {
	path := "/metadata/annotations/" + strings.ReplaceAll(gpuhealthv1.ClearsKey, "/", "~1")
	return json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": value},
		{"op": "remove", "path": path},
	})
}

// remove deletes the annotation if it still holds value (ClearsRemovalPatch).
func (w *clearWatcher) remove(ctx context.Context, value string) error {
	body, err := ClearsRemovalPatch(value)
	if err != nil {
		return err
	}
	patched, err := w.client.CoreV1().Nodes().Patch(ctx, w.nodes.NodeName(), types.JSONPatchType, body, metav1.PatchOptions{FieldManager: "gpuhealth-agent"})
	switch {
	case apierrors.IsNotFound(err):
		return nil // the Node is gone, and its requests with it
	case apierrors.IsForbidden(err):
		if value != w.refused {
			w.refused = value
			w.recorder.Eventf(w.nodeRef, corev1.EventTypeWarning, gpuhealthv1.EventClearsNotRemoved,
				"gpuhealth applied the clear requests but may not remove %s (an admission policy older than gpuhealth clear?): %v; "+
					"it tries again, and applies them again if it restarts first", gpuhealthv1.ClearsKey, err)
		}
		return fmt.Errorf("remove %s: %w", gpuhealthv1.ClearsKey, err)
	case err != nil:
		// Among them: the test failed because the annotation changed since it was read.
		return fmt.Errorf("remove %s: %w", gpuhealthv1.ClearsKey, err)
	}
	w.nodes.Wrote(patched)
	w.applied, w.refused = nil, ""
	return nil
}

// apply clears what one request names and says so in an Event.
func (w *clearWatcher) apply(ctx context.Context, uuid string, c gpuhealthv1.Clear) {
	logger := klog.FromContext(ctx)
	sel, _ := gpuhealthv1.ParseConditionSelector(c.Condition) // ParseClears checked it
	res := clearConditions(w.monitor, uuid, sel, w.clock.Now())
	what := sel.String()
	if what == "" {
		what = "every condition"
	}
	switch {
	case !res.found:
		logger.Info("A clear request names a GPU this node does not have", "gpu", uuid, "condition", what, "by", c.By)
		w.recorder.Eventf(w.nodeRef, corev1.EventTypeWarning, gpuhealthv1.EventClearMatchedNothing,
			"gpuhealth cleared nothing: this node has no GPU %s (request for %s %s)", uuid, what, c.Message())
	case len(res.cleared) == 0:
		logger.Info("A clear request matched no condition", "gpu", uuid, "condition", what, "by", c.By, "inEffect", res.remaining)
		w.recorder.Eventf(w.nodeRef, corev1.EventTypeWarning, gpuhealthv1.EventClearMatchedNothing,
			"gpuhealth cleared nothing on %s: %s; requested %s", res.device, res.nothingMatched(sel), c.Message())
	default:
		logger.Info("Cleared conditions at an operator's request", "gpu", uuid, "cleared", res.cleared, "by", c.By, "reason", c.Reason)
		w.recorder.Eventf(w.nodeRef, corev1.EventTypeNormal, gpuhealthv1.EventConditionsCleared,
			"gpuhealth cleared %s on %s, requested %s; %s", strings.Join(res.cleared, ", "), res.device, c.Message(), res.now())
	}
}

// clearResult is what clearConditions did.
type clearResult struct {
	found bool
	// device names the GPU: "GPU 1 (GPU-...)".
	device string
	// cleared are the reasons of the conditions it ended; remaining those in effect after it.
	cleared, remaining []string
	health             health.Severity
}

func (r clearResult) nothingMatched(sel gpuhealthv1.ConditionSelector) string {
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

// clearConditions ends the conditions sel selects on the GPU uuid and on its MIG instances
// through the Monitor, which publishes each change with its transitions (reporters, the
// checkpoint, the GPURecovered Event and the transition metric follow).
func clearConditions(m *health.Monitor, uuid string, sel gpuhealthv1.ConditionSelector, now time.Time) clearResult {
	tracker := m.Tracker()
	snap := tracker.Snapshot()
	gpu := findDevice(snap, uuid)
	if gpu == nil {
		return clearResult{}
	}
	res := clearResult{found: true, device: fmt.Sprintf("GPU %d (%s)", gpu.Device.Index, gpu.Device.UUID)}
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
			if sel.Matches(c) {
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
