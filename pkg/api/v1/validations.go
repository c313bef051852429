package v1

import (
	"fmt"
	"strings"
	"time"
)

// ValidationRequestsKey holds operators' requests to validate a GPU, written by `gpuhealth
// validate`: a JSON object keyed by GPU UUID whose values are ValidationRequest. The agent of the
// Node applies each request once (the GPU leaves service, waits until no pod holds it, and an
// active test decides whether it comes back: docs/remediation.md), says so in Events, and then
// removes the annotation (only when it still holds what the agent applied). The admission
// policy lets the agent remove the annotation and never add or change it.
const ValidationRequestsKey = "gpuhealth.dev/gpu-validation-requests"

// Reasons of the Events about validations, on the Node. The verdicts' Events carry the GPU's
// index and UUID first, as "GPU 2 (GPU-...): ...".
const (
	// EventValidationStarted (Normal): the test of a GPU started.
	EventValidationStarted = "GPUValidationStarted"
	// EventValidationPassed (Normal): it passed; the GPU goes back after its probation.
	EventValidationPassed = "GPUValidationPassed"
	// EventValidationFailed (Warning): it failed: a failed repair attempt.
	EventValidationFailed = "GPUValidationFailed"
	// EventValidationError (Warning): it gave no verdict; the GPU stays out, tried again later.
	EventValidationError = "GPUValidationError"
	// EventValidationNotConfigured (Warning): a request reached a node whose agent does not
	// validate (remediation.validation off), or named a GPU it does not have.
	EventValidationNotConfigured = "GPUValidationNotConfigured"
	// EventMalformedValidationRequests (Warning): ValidationRequestsKey does not parse; nothing
	// was applied or removed.
	EventMalformedValidationRequests = "MalformedValidationRequests"
	// EventValidationRequestsNotRemoved (Warning): the requests were applied but the agent may
	// not remove ValidationRequestsKey (an admission policy that predates it).
	EventValidationRequestsNotRemoved = "ValidationRequestsNotAcknowledged"
)

// ValidationRequest is one request to validate a GPU: why, who asked and when. By and At are
// what the requester wrote, not facts the API server vouches for.
type ValidationRequest struct {
	// Index is the GPU's index when the request was written, for people reading it.
	Index  int       `json:"index"`
	Reason string    `json:"reason"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
}

// ParseValidationRequests decodes ValidationRequestsKey's value; an empty value means none.
// Every request must name a GPU and give a reason: a value with one bad request is refused
// whole, so that nothing is applied from a mistyped annotation.
func ParseValidationRequests(value string) (map[string]ValidationRequest, error) {
	out, err := parseRequests[ValidationRequest](ValidationRequestsKey, value)
	if err != nil {
		return nil, err
	}
	for uuid, r := range out {
		if strings.TrimSpace(r.Reason) == "" {
			return nil, fmt.Errorf("%s: %s: no reason", ValidationRequestsKey, uuid)
		}
	}
	return out, nil
}

// FormatValidationRequests encodes requests as ValidationRequestsKey's value; "" when there
// are none.
func FormatValidationRequests(requests map[string]ValidationRequest) (string, error) {
	return formatByUUID(requests)
}

// Message is how a request reads in an Event: "by alice at 2026-11-30T10:00:00Z: after RMA".
func (r ValidationRequest) Message() string {
	return Clear{Reason: r.Reason, By: r.By, At: r.At}.Message()
}
