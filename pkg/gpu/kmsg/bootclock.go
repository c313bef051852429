package kmsg

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootClock returns the wall time and the time since boot on the clock the kernel stamps its
// log with. printk uses the scheduler clock, which like CLOCK_MONOTONIC_RAW counts the
// hardware timer without NTP's corrections; CLOCK_MONOTONIC would drift from it by the
// oscillator's error (seconds a day on some machines).
func bootClock() (time.Time, time.Duration) {
	now := time.Now()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_RAW, &ts); err != nil {
		// Unreachable on Linux. Without the clock every record is placed at the time it is
		// read: wallTime clamps a time since boot past "now" to now.
		return now, 0
	}
	return now, time.Duration(ts.Nano())
}
