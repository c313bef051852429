package dra

import (
	"regexp"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The taint contract every gpuhealth writer of DRA device taints shares: the agent's
// DeviceTaintRules and a driver's own slices (SetTaints) name a sick GPU the same way.

// TaintEffect maps a device's state to a taint effect: NoExecute for an Unhealthy device whose
// condition asks for eviction when noExecute allows it, NoSchedule for other Unhealthy devices,
// None (visible, no effect) otherwise.
func TaintEffect(d health.DeviceStatus, noExecute bool) resourceapi.DeviceTaintEffect {
	switch {
	case d.Health == health.Unhealthy && d.Evict && noExecute:
		return resourceapi.DeviceTaintEffectNoExecute
	case d.Health == health.Unhealthy:
		return resourceapi.DeviceTaintEffectNoSchedule
	default:
		return resourceapi.DeviceTaintEffectNone
	}
}

// TaintKeyValue returns the taint key (TaintKeyPrefix and the worst condition's type) and value
// (the XID code, else the condition's reason as a label value) for a device.
func TaintKeyValue(d health.DeviceStatus) (key, value string) {
	conds := health.WorstFirst(d.Conditions)
	if len(conds) == 0 {
		return TaintKeyPrefix + "unhealthy", ""
	}
	c := conds[0]
	name, ok := taintNames[c.Type]
	if !ok {
		name = kebab(string(c.Type))
	}
	key = TaintKeyPrefix + name
	if c.Type == health.ConditionXID {
		return key, strconv.FormatUint(uint64(c.Code), 10)
	}
	return key, LabelValue(c.Reason)
}

// taintNames are the taint key suffixes of the built-in condition types.
var taintNames = map[health.ConditionType]string{
	health.ConditionXID:                 "xid",
	health.ConditionGPULost:             "gpu-lost",
	health.ConditionECCUncorrected:      "ecc-uncorrected",
	health.ConditionECCCorrectedStorm:   "ecc-storm",
	health.ConditionRowRemapFailure:     "row-remap-failure",
	health.ConditionRowRemapPending:     "row-remap-pending",
	health.ConditionRetiredPagesPending: "retired-pages-pending",
	health.ConditionThermal:             "thermal",
	health.ConditionClockThrottle:       "clock-throttle",
	health.ConditionPCIeReplayRate:      "pcie-replays",
	health.ConditionNVLinkDown:          "nvlink-down",
	health.ConditionNVLinkErrorRate:     "nvlink-errors",
	health.ConditionRecoveryAction:      "recovery-action",
	health.ConditionAdmin:               "admin-drain",
}

var invalidLabel = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// LabelValue makes s a valid label value: allowed characters, at most 63, alphanumeric ends.
func LabelValue(s string) string {
	s = invalidLabel.ReplaceAllString(s, "-")
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-_.")
}

// kebab turns a condition type such as "ECCUncorrected" or "GPULost" into "ecc-uncorrected" or
// "gpu-lost".
func kebab(s string) string {
	var b strings.Builder
	for i, r := range s {
		upper := r >= 'A' && r <= 'Z'
		if upper && i > 0 {
			prevLower := s[i-1] >= 'a' && s[i-1] <= 'z'
			nextLower := i+1 < len(s) && s[i+1] >= 'a' && s[i+1] <= 'z'
			prevUpper := s[i-1] >= 'A' && s[i-1] <= 'Z'
			if prevLower || (prevUpper && nextLower) {
				b.WriteByte('-')
			}
		}
		if upper {
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
