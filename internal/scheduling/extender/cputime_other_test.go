//go:build !linux

package extender

import "time"

// processCPU is measured on Linux only.
func processCPU() (time.Duration, bool) { return 0, false }
