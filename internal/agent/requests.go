package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// Retrying a removal the API server refused: from a second, doubling, to five minutes.
const (
	clearRetryFirst = time.Second
	clearRetryMax   = 5 * time.Minute
)

// requestKind is one kind of operators' requests that an annotation on the Node carries and
// the node's agent applies once: clears (`gpuhealth clear`) and validations (`gpuhealth
// validate`).
type requestKind struct {
	// key is the annotation; name names the requests in logs ("clear").
	key, name string
	// malformedReason and notRemovedReason are the reasons of the Warnings for an annotation
	// that does not parse, and for requests applied that the agent may not remove.
	malformedReason, notRemovedReason string
	// pending parses the annotation's value into its requests; an error leaves it all alone.
	pending func(value string) ([]pendingRequest, error)
}

// pendingRequest is one request on the Node: what identifies it while it is there, when it was
// written (zero if it does not say), and how to apply it (which says what it did in an Event).
type pendingRequest struct {
	id    string
	at    time.Time
	apply func(ctx context.Context)
}

// requestMemory remembers the requests applied across restarts (health.Monitor does, in its
// checkpoint).
type requestMemory interface {
	RequestApplied(key string) bool
	RememberRequest(key string, at, now time.Time)
}

// requestWatcher applies the requests of one kind on this agent's Node, each once, then removes
// the annotation, but only if it still holds exactly what was applied (a JSON patch that tests
// the value), so a request added meanwhile is never lost. Once removed, a restart cannot apply
// a request again. A malformed annotation is reported and left alone: nothing is applied from
// it, and nothing in it is lost.
//
// Each request applied is also remembered (memory: the health checkpoint), so that one the agent
// could not remove (a policy that forbids it, the API server away, a crash in between) is not
// applied again by the next process.
type requestWatcher struct {
	nodes    *nodecache.Cache
	client   kube.Interface
	clock    clock.Clock
	recorder record.EventRecorder
	nodeRef  *corev1.ObjectReference
	kind     requestKind
	memory   requestMemory

	// applied holds the requests of the annotation that are applied and not yet removed: a
	// removal that failed is tried again without applying them again.
	applied map[string]bool
	// malformed and refused are the last values reported in a Warning, so that every update
	// of the Node does not repeat it.
	malformed, refused string
}

// run follows the Node until ctx is done. Only its goroutine touches the watcher's state.
func (w *requestWatcher) run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("watcher", w.kind.name+"s")
	ctx = klog.NewContext(ctx, logger)
	// The informer's handler only pokes: applying and acknowledging happen on this goroutine,
	// from the newest Node the cache knows, never on the informer's.
	poke := make(chan struct{}, 1)
	notify := func(node *corev1.Node) {
		if _, ok := node.Annotations[w.kind.key]; !ok {
			return
		}
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	if err := w.nodes.AddEventHandler(kube.Handlers(notify, nil)); err != nil {
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
				logger.V(2).Info("Requests changed meanwhile; reading them again", "kind", w.kind.name, "in", delay)
			} else {
				logger.Error(err, "Removing the applied requests failed; trying again", "kind", w.kind.name, "in", delay)
			}
			retry = w.clock.After(delay)
			continue
		}
		delay = 0
	}
}

// sync applies the requests on the Node that are not applied yet and removes the annotation.
func (w *requestWatcher) sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	node, err := w.nodes.Get(ctx)
	if err != nil {
		return err
	}
	value, present := node.Annotations[w.kind.key]
	if !present {
		w.applied = nil
		return nil
	}
	requests, err := w.kind.pending(value)
	if err != nil {
		if value != w.malformed {
			w.malformed = value
			logger.Error(err, "Ignoring a malformed requests annotation; nothing applied, nothing removed", "kind", w.kind.name)
			w.recorder.Eventf(w.nodeRef, corev1.EventTypeWarning, w.kind.malformedReason,
				"gpuhealth applied none of the %s requests and left them on the Node: %v", w.kind.name, err)
		}
		return nil
	}
	w.malformed = ""
	pending := map[string]bool{}
	for _, r := range requests {
		pending[r.id] = true
		if !w.applied[r.id] {
			w.applyOnce(ctx, r)
		}
	}
	w.applied = pending
	return w.remove(ctx, value)
}

// applyOnce applies r unless the memory says an earlier process did, and remembers it.
func (w *requestWatcher) applyOnce(ctx context.Context, r pendingRequest) {
	if w.memory == nil {
		r.apply(ctx)
		return
	}
	sum := sha256.Sum256([]byte(r.id))
	key := w.kind.name + "/" + hex.EncodeToString(sum[:16])
	if w.memory.RequestApplied(key) {
		klog.FromContext(ctx).V(2).Info("Request applied before this process started; not applied again", "kind", w.kind.name, "key", key)
		return
	}
	r.apply(ctx)
	now := w.clock.Now()
	at := r.at
	if at.IsZero() {
		at = now
	}
	w.memory.RememberRequest(key, at, now)
}

// removalPatch is the JSON patch that removes the annotation key only while it still holds
// value, so a request written since the Node was read stays.
func removalPatch(key, value string) ([]byte, error) {
	path := "/metadata/annotations/" + strings.ReplaceAll(key, "/", "~1")
	return json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": value},
		{"op": "remove", "path": path},
	})
}

// remove deletes the annotation if it still holds value (removalPatch).
func (w *requestWatcher) remove(ctx context.Context, value string) error {
	body, err := removalPatch(w.kind.key, value)
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
			w.recorder.Eventf(w.nodeRef, corev1.EventTypeWarning, w.kind.notRemovedReason,
				"gpuhealth applied the %s requests but may not remove %s (an admission policy older than gpuhealth %s?): %v; "+
					"it tries again, and does not apply them again after a restart (its checkpoint remembers them)", w.kind.name, w.kind.key, w.kind.name, err)
		}
		return fmt.Errorf("remove %s: %w", w.kind.key, err)
	case err != nil:
		// Among them: the test failed because the annotation changed since it was read.
		return fmt.Errorf("remove %s: %w", w.kind.key, err)
	}
	w.nodes.Wrote(patched)
	w.applied, w.refused = nil, ""
	return nil
}
