package cmdutil

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
)

// Reexec replaces this process with a fresh image of its own binary: same pid, same arguments,
// the environment with set (KEY=VALUE entries) added or replaced. A process that used NVML does
// it to let go of the driver's library, which the dynamic loader never unmaps
// (docs/nvml.md, "When the driver goes away"). The log's buffered lines are flushed first: the
// new image starts with none. It returns only when the exec fails.
func Reexec(set ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("re-executing this process: %w", err)
	}
	env := make([]string, 0, len(os.Environ())+len(set))
	for _, kv := range os.Environ() {
		key, _, _ := strings.Cut(kv, "=")
		if !hasKey(set, key) {
			env = append(env, kv)
		}
	}
	env = append(env, set...)
	klog.Flush()
	if err := syscall.Exec(exe, os.Args, env); err != nil {
		return fmt.Errorf("re-executing %s: %w", exe, err)
	}
	return nil
}

func hasKey(set []string, key string) bool {
	for _, kv := range set {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}
