package agent

import (
	"context"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/remediation"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// validationRequests is the kind of requests `gpuhealth validate` writes on the Node
// (gpuhealthv1.ValidationRequestsKey): each is handed once to remediation, which keeps the GPU
// out of service until an active test of it passes. A node whose agent does not validate, or
// that has no such GPU, says so in a Warning.
func validationRequests(rem *remediation.Controller, monitor *health.Monitor, recorder record.EventRecorder, nodeRef *corev1.ObjectReference) requestKind {
	apply := func(ctx context.Context, uuid string, r gpuhealthv1.ValidationRequest) {
		logger := klog.FromContext(ctx)
		gpu := findDevice(monitor.Snapshot(), uuid)
		switch {
		case gpu == nil || gpu.Device.MIG != nil:
			logger.Info("A validation request names no GPU of this node", "gpu", uuid, "by", r.By)
			recorder.Eventf(nodeRef, corev1.EventTypeWarning, gpuhealthv1.EventValidationNotConfigured,
				"gpuhealth validates nothing: this node has no GPU %s (request %s)", uuid, r.Message())
		case rem == nil || !rem.Validates():
			logger.Info("A validation request reached an agent that does not validate", "gpu", uuid, "by", r.By)
			recorder.Eventf(nodeRef, corev1.EventTypeWarning, gpuhealthv1.EventValidationNotConfigured,
				"GPU %d (%s): gpuhealth cannot validate it: remediation.validation is not enabled on this node (request %s)",
				gpu.Device.Index, gpu.Device.UUID, r.Message())
		default:
			logger.Info("Validating a GPU at an operator's request", "gpu", gpu.Device.UUID, "by", r.By, "reason", r.Reason)
			rem.RequestValidation(gpu.Device.UUID, r.Message())
		}
	}
	return requestKind{
		key: gpuhealthv1.ValidationRequestsKey, name: "validation", malformedReason: gpuhealthv1.EventMalformedValidationRequests,
		notRemovedReason: gpuhealthv1.EventValidationRequestsNotRemoved,
		pending: func(value string) ([]pendingRequest, error) {
			requests, err := gpuhealthv1.ParseValidationRequests(value)
			if err != nil {
				return nil, err
			}
			out := make([]pendingRequest, 0, len(requests))
			for _, uuid := range slices.Sorted(maps.Keys(requests)) {
				r := requests[uuid]
				out = append(out, pendingRequest{id: requestKey(uuid, r), at: r.At, apply: func(ctx context.Context) { apply(ctx, uuid, r) }})
			}
			return out, nil
		},
	}
}

// ValidationRequestsRemovalPatch is the JSON patch the agent sends to remove the validation
// requests it applied: only while the annotation still holds value.
func ValidationRequestsRemovalPatch(value string) ([]byte, error) {
	return removalPatch(gpuhealthv1.ValidationRequestsKey, value)
}
