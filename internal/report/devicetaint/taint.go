package devicetaint

import (
	"regexp"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Effect maps a device's state to a taint effect.
func Effect(d health.DeviceStatus, noExecute bool) resourceapi.DeviceTaintEffect {
	switch {
	case d.Health == health.Unhealthy && d.Evict && noExecute:
		return resourceapi.DeviceTaintEffectNoExecute
	case d.Health == health.Unhealthy:
		return resourceapi.DeviceTaintEffectNoSchedule
	default:
		return resourceapi.DeviceTaintEffectNone
	}
}

// Taint returns the taint key and value for a device's worst condition.
func Taint(d health.DeviceStatus) (key, value string) {
	conds := report.WorstFirst(d.Conditions)
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
	return key, labelValue(c.Reason)
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

// RuleName is the DeviceTaintRule name for a device UUID.
func RuleName(uuid string) string {
	return "gpuhealth-" + strings.Trim(invalidName.ReplaceAllString(strings.ToLower(uuid), "-"), "-")
}

var (
	invalidName  = regexp.MustCompile(`[^a-z0-9-]+`)
	invalidLabel = regexp.MustCompile(`[^A-Za-z0-9._-]+`)
)

// labelValue makes s a valid label value: allowed characters, at most 63, alphanumeric ends.
func labelValue(s string) string {
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
