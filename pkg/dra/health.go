package dra

import (
	"unicode/utf8"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// maxMessage is the longest device health message the kubelet keeps.
const maxMessage = 1024

// DeviceID names a driver's device the way the kubelet does: its pool and its name in the pool.
type DeviceID struct {
	Pool   string
	Device string
}

// Message says why a device is not Healthy ("Degraded: <reason>: <message>" for a Degraded
// one), empty when it is; at most 1024 characters, as the kubelet keeps.
func Message(d health.DeviceStatus) string {
	conds := health.WorstFirst(d.Conditions)
	if d.Health == health.Healthy || len(conds) == 0 {
		if d.Unmonitored {
			return "the GPU backend cannot watch this device"
		}
		return ""
	}
	c := conds[0]
	msg := c.Reason
	if c.Message != "" {
		msg += ": " + c.Message
	}
	if d.Health == health.Degraded {
		msg = "Degraded: " + msg
	}
	if len(msg) > maxMessage {
		cut := maxMessage - 3
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut-- // never split a character
		}
		msg = msg[:cut] + "..."
	}
	return msg
}
