package remediation

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
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
	f, err := readStateFile(path)
	if err != nil || f.BootID != bootID {
		return nil, err
	}
	return f.GPUs, nil
}

// UnderRepairBeforeReboot lists the GPUs that a state file of another boot than bootID has
// under repair (or given up on): after a reboot they are validated before they are offered.
func UnderRepairBeforeReboot(path, bootID string) ([]string, error) {
	f, err := readStateFile(path)
	if err != nil || f.BootID == bootID {
		return nil, err
	}
	var out []string
	for uuid, st := range f.GPUs {
		if st.Phase != PhaseIdle {
			out = append(out, uuid)
		}
	}
	slices.Sort(out)
	return out, nil
}

func readStateFile(path string) (stateFile, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return stateFile{}, nil
	}
	if err != nil {
		return stateFile{}, err
	}
	var f stateFile
	if err := json.Unmarshal(data, &f); err != nil {
		return stateFile{}, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// SaveState writes the states atomically: a crash leaves the old file or the new one.
func SaveState(path, bootID string, states map[string]State) error {
	data, err := json.Marshal(stateFile{BootID: bootID, GPUs: states})
	if err != nil {
		return err
	}
	return writeFileAtomic(path, data)
}
