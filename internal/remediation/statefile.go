package remediation

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
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
	return writeFileAtomic(path, data)
}
