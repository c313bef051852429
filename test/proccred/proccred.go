// Package proccred reads what /proc says of a running process's credentials, thread by thread,
// for tests that check a process gave up root: the kmsg relay's (internal/cli and test/e2e).
// It reads from outside the process, so a process that only believes it dropped its privileges
// is caught.
package proccred

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Nobody is what Threads says of a thread running as nobody (65534) with no effective capability.
const Nobody = "uid 65534 65534 65534 65534 capEff 0000000000000000"

// Threads returns, for each thread of process pid, "uid REAL EFFECTIVE SAVED FS capEff HEX" as
// its /proc/PID/task/TID/status says.
func Threads(pid int) ([]string, error) {
	statuses, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return nil, err
	}
	if len(statuses) == 0 {
		return nil, fmt.Errorf("no threads of process %d", pid)
	}
	var out []string
	for _, p := range statuses {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var uid, capEff string
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				uid = strings.Join(strings.Fields(v), " ")
			}
			if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
				capEff = strings.TrimSpace(v)
			}
		}
		out = append(out, "uid "+uid+" capEff "+capEff)
	}
	return out, nil
}
