package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// cdiClass is the CDI class of the driver's devices: <vendor>/device=<claim UID>-<device>.
const cdiClass = "device"

// visibleDevicesEnv is the variable the NVIDIA container toolkit reads to choose a container's
// GPUs.
const visibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

// cdiDevice is one allocated GPU under the CDI name it gets for one claim.
type cdiDevice struct {
	name string
	gpu  gpu
}

// cdiWriter writes the CDI specs of prepared claims, one file per claim, in the directory the
// container runtime reads them from.
type cdiWriter struct {
	dir    string
	vendor string
}

// qualifiedName is the CDI device ID the kubelet passes to the runtime (and shows as the
// resource ID of the device in pod status).
func (w cdiWriter) qualifiedName(device string) string {
	return w.vendor + "/" + cdiClass + "=" + device
}

func (w cdiWriter) path(claim types.UID) string {
	return filepath.Join(w.dir, fmt.Sprintf("%s-%s_%s.json", w.vendor, cdiClass, claim))
}

// write writes the claim's spec: every device sets GPU_DEVICE_<minor>=<UUID>, and any of them
// sets NVIDIA_VISIBLE_DEVICES to all the claim's GPUs. A real driver adds the device nodes and
// driver libraries (or leaves that to the NVIDIA container toolkit); the simulated GPUs have
// none. The file is replaced atomically, so a runtime never reads half of it.
func (w cdiWriter) write(claim types.UID, devices []cdiDevice) error {
	spec := cdispec.Spec{Kind: w.vendor + "/" + cdiClass}
	var uuids []string
	for _, d := range devices {
		uuids = append(uuids, d.gpu.UUID)
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           d.name,
			ContainerEdits: cdispec.ContainerEdits{Env: []string{fmt.Sprintf("GPU_DEVICE_%d=%s", d.gpu.Minor, d.gpu.UUID)}},
		})
	}
	if len(devices) > 0 {
		spec.ContainerEdits.Env = []string{visibleDevicesEnv + "=" + strings.Join(uuids, ",")}
	}
	version, err := cdispec.MinimumRequiredVersion(&spec)
	if err != nil {
		return fmt.Errorf("CDI spec of claim %s: %w", claim, err)
	}
	spec.Version = version
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("CDI spec of claim %s: %w", claim, err)
	}
	tmp, err := os.CreateTemp(w.dir, ".tmp-*.json")
	if err != nil {
		return fmt.Errorf("CDI spec of claim %s: %w", claim, err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("CDI spec of claim %s: %w", claim, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("CDI spec of claim %s: %w", claim, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("CDI spec of claim %s: %w", claim, err)
	}
	if err := os.Rename(tmp.Name(), w.path(claim)); err != nil {
		return fmt.Errorf("CDI spec of claim %s: %w", claim, err)
	}
	return nil
}

// remove removes the claim's spec; a claim without one is fine (unprepare is idempotent).
func (w cdiWriter) remove(claim types.UID) error {
	if err := os.Remove(w.path(claim)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("CDI spec of claim %s: %w", claim, err)
	}
	return nil
}
