package extender

import (
	"syscall"
	"time"
)

// processCPU is the CPU time the process has used so far, all threads (the collector's
// included). A call timed with it does not count the time other processes took the core for, so
// its percentiles stay comparable on a shared machine where wall-clock ones do not.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
