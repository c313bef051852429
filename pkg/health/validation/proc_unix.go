//go:build unix

package validation

import (
	"os/exec"
	"syscall"
)

// killGroup makes the command the leader of its own process group and has cancellation kill
// the whole group: dcgmi and wrapper scripts start children (a shell's sleep, nvvs under a
// local engine) that would otherwise outlive the timeout and hold the GPU.
func killGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
			return cmd.Process.Kill()
		}
		return nil
	}
}
