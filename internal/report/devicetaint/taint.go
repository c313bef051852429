package devicetaint

import (
	"regexp"
	"strings"
)

// RuleName is the DeviceTaintRule name for a device UUID.
func RuleName(uuid string) string {
	return "gpuhealth-" + strings.Trim(invalidName.ReplaceAllString(strings.ToLower(uuid), "-"), "-")
}

var invalidName = regexp.MustCompile(`[^a-z0-9-]+`)
