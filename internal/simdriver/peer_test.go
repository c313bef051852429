package simdriver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// nsDepth reads the same depth from a pidfd's fdinfo (what SO_PEERPIDFD gives) and from
// /proc/PID/status (the way before Linux 6.5): the simulator's own for a process of its pid
// namespace, one more for a process in a pid namespace of its own; a pidfd of a process that
// exited says so.
func TestNSDepth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("starts a process in a pid namespace of its own: needs root (make unit runs as root in CI)")
	}
	own, err := nsDepth("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		flags uintptr
		want  int
	}{
		{"this pid namespace", 0, own},
		{"a pid namespace of its own", syscall.CLONE_NEWPID, own + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: tc.flags}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(pidfd)
			fdinfo := fmt.Sprintf("/proc/self/fdinfo/%d", pidfd)
			for _, path := range []string{fdinfo, fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)} {
				if got, err := nsDepth(path); err != nil || got != tc.want {
					t.Errorf("nsDepth(%s) = %d, %v; want %d", path, got, err, tc.want)
				}
			}
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if got, err := nsDepth(fdinfo); !errors.Is(err, errExited) {
				t.Errorf("nsDepth of an exited process's pidfd = %d, %v; want errExited", got, err)
			}
		})
	}
}
