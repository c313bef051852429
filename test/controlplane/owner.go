package controlplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A test binary killed with SIGKILL (go test's -timeout, the CI runner, a person) takes its
// components with it (Pdeathsig) and their mounts (private mount namespaces), but cannot remove its
// temporary cluster directory, nor stop the shims and containers of nodes with real containers. Each such directory records its owner, and every Start removes the
// directories whose owner no longer runs.

// tempDirPattern names the temporary cluster directories Start creates.
const tempDirPattern = "gpuhealth-controlplane-"

// ownerFile holds "PID STARTTIME" of the process that created the directory; the start time (in
// clock ticks since boot) tells a reused PID apart.
const ownerFile = "owner"

// processStart returns the start time of pid in clock ticks since boot (/proc/PID/stat field 22).
func processStart(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) may hold spaces and parentheses: fields after it start after the
	// last ')'.
	rest := string(data[strings.LastIndexByte(string(data), ')')+1:])
	fields := strings.Fields(rest)
	const startTimeIndex = 22 - 3 // field 22, counted from field 3 (state)
	if len(fields) <= startTimeIndex {
		return "", fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	return fields[startTimeIndex], nil
}

func writeOwner(dir string) error {
	start, err := processStart(os.Getpid())
	if err != nil {
		return fmt.Errorf("record the owner of %s: %w", dir, err)
	}
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(fmt.Sprintf("%d %s\n", os.Getpid(), start)), 0o600)
}

// ownerAlive reports whether the process recorded in dir still runs. A directory without a
// readable owner record is treated as alive: it may be being created right now.
func ownerAlive(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		return true
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil {
		return true
	}
	start, err := processStart(pid)
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	return err != nil || start == fields[1]
}

// sweepStaleDirs removes temporary cluster directories under root whose owner has gone, and
// returns what it removed.
func sweepStaleDirs(root string) []string {
	matches, _ := filepath.Glob(filepath.Join(root, tempDirPattern+"*"))
	var removed []string
	for _, dir := range matches {
		if ownerAlive(dir) {
			continue
		}
		// Containers of a killed test's nodes outlive it (their shims left its process tree).
		_ = killShims(dir + "/")
		if err := os.RemoveAll(dir); err == nil {
			removed = append(removed, dir)
		}
	}
	return removed
}
