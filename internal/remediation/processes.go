package remediation

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// DeviceHolders names the processes that have the GPU's device file (/dev/nvidia<minor>) open,
// "<pid> (<command>)", read from procRoot ("" is /proc), leaving self (this process) out. A GPU
// reset fails while any of them runs; a failed attempt names them. The agent sees the host's
// processes only with the host's PID namespace: in its own it finds those of its pod.
func DeviceHolders(procRoot string, minor, self int) ([]string, error) {
	if procRoot == "" {
		procRoot = "/proc"
	}
	device := "/dev/nvidia" + strconv.Itoa(minor)
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		fds, err := os.ReadDir(filepath.Join(procRoot, e.Name(), "fd"))
		if err != nil {
			continue // gone, or not ours to read
		}
		if !slices.ContainsFunc(fds, func(fd os.DirEntry) bool {
			target, err := os.Readlink(filepath.Join(procRoot, e.Name(), "fd", fd.Name()))
			return err == nil && target == device
		}) {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join(procRoot, e.Name(), "comm"))
		out = append(out, fmt.Sprintf("%d (%s)", pid, strings.TrimSpace(string(comm))))
	}
	slices.SortFunc(out, func(a, b string) int {
		pa, _ := strconv.Atoi(strings.Fields(a)[0])
		pb, _ := strconv.Atoi(strings.Fields(b)[0])
		return pa - pb
	})
	return out, nil
}
