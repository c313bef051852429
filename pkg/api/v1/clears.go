package v1

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// ClearsKey holds operators' requests to clear GPU conditions the agent raised, written by
// `gpuhealth clear`: a JSON object keyed by GPU UUID whose values are lists of Clear. The agent of
// the Node applies each request once, says so in an Event, and then removes the annotation (only
// when it still holds what the agent applied), so a request is never applied again and a
// condition that returns later is raised again. The admission policy lets the agent remove the
// annotation and never add or change it.
const ClearsKey = "gpuhealth.dev/gpu-clears"

// Reasons of the Events the agent posts about clear requests, on its Node.
const (
	// EventConditionsCleared (Normal): a request cleared conditions; the message names them, the
	// GPU, who asked and why, and what is left in effect.
	EventConditionsCleared = "GPUConditionsCleared"
	// EventClearMatchedNothing (Warning): a request named no condition in effect, or a GPU the
	// node does not have.
	EventClearMatchedNothing = "GPUClearMatchedNothing"
	// EventMalformedClears (Warning): ClearsKey does not parse; nothing was applied or removed.
	EventMalformedClears = "MalformedClears"
	// EventClearsNotRemoved (Warning): the requests were applied but the agent may not remove
	// ClearsKey (an admission policy that predates it).
	EventClearsNotRemoved = "ClearsNotAcknowledged"
)

// Clear is one request to clear a false positive: which condition (a ConditionSelector in its
// text form; empty for every condition but an administrative drain), why, who asked and when.
// At bounds what it clears: only conditions that began at or before it (a request left in a
// manifest, or written while the agent was down, never ends a fault raised after it).
// By and At are what the requester wrote, not facts the API server vouches for: the audit log
// has who wrote the annotation.
type Clear struct {
	// Index is the GPU's index when the request was written, for people reading the
	// annotation; -1 when the GPU was named by a UUID the agent had not reported.
	Index     int       `json:"index"`
	Condition string    `json:"condition,omitempty"`
	Reason    string    `json:"reason"`
	By        string    `json:"by"`
	At        time.Time `json:"at"`
}

// ParseClears decodes ClearsKey's value. An empty value means no requests. Every request must
// name a GPU, give a reason, say when it was written (At: a request ends only conditions that
// began by then) and, if it names a condition, one ParseConditionSelector accepts:
// a value with one bad request is refused whole, so that nothing is applied from a mistyped
// annotation.
func ParseClears(value string) (map[string][]Clear, error) {
	clears, err := parseRequests[[]Clear](ClearsKey, value)
	if err != nil {
		return nil, err
	}
	for uuid, list := range clears {
		for i, c := range list {
			if strings.TrimSpace(c.Reason) == "" {
				return nil, fmt.Errorf("%s: %s[%d]: no reason", ClearsKey, uuid, i)
			}
			if _, err := ParseConditionSelector(c.Condition); err != nil {
				return nil, fmt.Errorf("%s: %s[%d]: %w", ClearsKey, uuid, i, err)
			}
			if c.At.IsZero() {
				return nil, fmt.Errorf(`%s: %s[%d]: no "at" (when the request was written): without it a request would clear faults raised after it`, ClearsKey, uuid, i)
			}
		}
	}
	return clears, nil
}

// FormatClears encodes clears as ClearsKey's value; "" when there are none (remove the
// annotation).
func FormatClears(clears map[string][]Clear) (string, error) {
	n := 0
	for _, list := range clears {
		n += len(list)
	}
	if n == 0 {
		return "", nil
	}
	return formatByUUID(clears)
}

// Message is how a request reads in an Event: "by alice at 2026-11-30T10:00:00Z: a loose cable".
func (c Clear) Message() string {
	by := c.By
	if by == "" {
		by = "unknown"
	}
	msg := "by " + by
	if !c.At.IsZero() {
		msg += " at " + c.At.UTC().Format(time.RFC3339)
	}
	return msg + ": " + c.Reason
}

// ConditionSelector names conditions of a GPU, in the forms `gpuhealth status` and the
// gpu-health annotation show: a condition's reason (XID79, UncorrectedECCErrors) or its type
// (XID, NVLinkDown), compared without regard to case, or TYPE:CODE for the one condition of that
// type and code (XID:79, NVLinkDown:3 for link 3). The zero selector selects every condition but
// an administrative drain; no selector ever selects a drain (gpuhealth undrain ends it).
type ConditionSelector struct {
	// Name is a reason or a type; empty selects every condition but a drain.
	Name string
	// Code narrows a type to one code when HasCode is set.
	Code    uint32
	HasCode bool
}

// maxSelectorLen bounds a selector's text: reasons are short identifiers.
const maxSelectorLen = 128

// errSelectsDrain is why no selector may name a drain.
var errSelectsDrain = errors.New("a drain is not a condition to clear: gpuhealth undrain ends it")

// ParseConditionSelector reads a selector's text form; "" is the zero selector.
func ParseConditionSelector(s string) (ConditionSelector, error) {
	if s == "" {
		return ConditionSelector{}, nil
	}
	if len(s) > maxSelectorLen || strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0 {
		return ConditionSelector{}, fmt.Errorf("condition %q: want a reason (XID79), a type (XID) or TYPE:CODE (XID:79), as gpuhealth status shows them", s)
	}
	sel := ConditionSelector{Name: s}
	if name, code, ok := strings.Cut(s, ":"); ok {
		n, err := strconv.ParseUint(code, 10, 32)
		if name == "" || err != nil {
			return ConditionSelector{}, fmt.Errorf("condition %q: TYPE:CODE wants a type and a decimal code, such as XID:79", s)
		}
		sel = ConditionSelector{Name: name, Code: uint32(n), HasCode: true}
	}
	if strings.EqualFold(sel.Name, health.ReasonAdminDrain) || strings.EqualFold(sel.Name, string(health.ConditionAdmin)) {
		return ConditionSelector{}, errSelectsDrain
	}
	return sel, nil
}

// String is the selector's text form; "" for the zero selector.
func (s ConditionSelector) String() string {
	if s.HasCode {
		return s.Name + ":" + strconv.FormatUint(uint64(s.Code), 10)
	}
	return s.Name
}

// Matches reports whether the selector selects c.
func (s ConditionSelector) Matches(c health.Condition) bool {
	switch {
	case c.Type == health.ConditionAdmin:
		return false
	case s.Name == "":
		return true
	case s.HasCode:
		return strings.EqualFold(string(c.Type), s.Name) && c.Code == s.Code
	default:
		return strings.EqualFold(c.Reason, s.Name) || strings.EqualFold(string(c.Type), s.Name)
	}
}
