package remediation

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// StateFileName is the state file's name, next to the agent's checkpoint.
const StateFileName = "remediation.json"

// stateFile is the state file's content.
type stateFile struct {
	// BootID is the boot the states belong to: a reboot resets every GPU, so the states of an
	// earlier boot are dropped.
	BootID string           `json:"bootID"`
	GPUs   map[string]State `json:"gpus"`
}

// LoadState reads the repair states saved for bootID. A missing file, or one from another boot,
// is no state.
func LoadState(path, bootID string) (map[string]State, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f stateFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.BootID != bootID {
		return nil, nil
	}
	return f.GPUs, nil
}

// SaveState writes the states atomically: a crash leaves the old file or the new one.
func SaveState(path, bootID string, states map[string]State) error {
	data, err := json.Marshal(stateFile{BootID: bootID, GPUs: states})
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".remediation-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; cleans up after a failure
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
