package kmsg

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootClock returns the wall time and the time since boot on CLOCK_MONOTONIC, read together.
// The kernel stamps records with local_clock(), which is not a clock userspace can read; the
// source takes CLOCK_MONOTONIC for it (dmesg -T takes CLOCK_BOOTTIME, the same clock but for
// time spent suspended). On the machine the tests ran on (a VM up
// for three hours) a fresh record's stamp was within 1 ms of CLOCK_MONOTONIC and 249 ms behind
// CLOCK_MONOTONIC_RAW (TestWallTimeOfAFreshRecordOnTheRealDevice measures it); both are far inside
// the de-duplication window, and the wall time is read afresh for each record, so the two clocks'
// drift over a long uptime does not accumulate.
func bootClock() (time.Time, time.Duration) {
	now := time.Now()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// Unreachable on Linux. Without the clock every record is placed at the time it is
		// read: wallTime clamps a time since boot past "now" to now.
		return now, 0
	}
	return now, time.Duration(ts.Nano())
}
