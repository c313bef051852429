package simdriver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// nvidiaMajor is the character-device major number the NVIDIA kernel module registers; GPU i is
// minor i (its nvmlDeviceGetMinorNumber) and the control device minor 255.
const (
	nvidiaMajor    = 195
	nvidiaCtlMinor = 255
)

// DeviceNodes lists the device nodes a driver root of gpus GPUs has: dev/nvidiactl and
// dev/nvidia<minor>, relative to the root.
func DeviceNodes(gpus int) []string {
	nodes := []string{"dev/nvidiactl"}
	for i := range gpus {
		nodes = append(nodes, fmt.Sprintf("dev/nvidia%d", i))
	}
	return nodes
}

// installDeviceNodes creates the driver root's NVIDIA device nodes, as the driver's container or
// nvidia-modprobe does on a node: character devices of major 195, which device plugins and the
// container toolkit stat and hand to containers (nothing opens them here: NVML calls go to the
// simulator). Creating a device node takes CAP_MKNOD; without it, or on a read-only driver
// root, none is created and the reason is returned for the log: NVML works without them.
// Existing nodes are kept.
func installDeviceNodes(root string, gpus int) error {
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		return fmt.Errorf("device nodes not created: %w", err)
	}
	for i, rel := range DeviceNodes(gpus) {
		minor := uint32(nvidiaCtlMinor)
		if i > 0 {
			minor = uint32(i - 1)
		}
		path := filepath.Join(root, rel)
		err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(nvidiaMajor, minor)))
		switch {
		case err == nil, errors.Is(err, unix.EEXIST):
		case errors.Is(err, unix.EPERM):
			return fmt.Errorf("device nodes not created (%s): creating a device node takes CAP_MKNOD", path)
		default:
			return fmt.Errorf("device nodes not created: %s: %w", path, err)
		}
	}
	return nil
}
