// Package pci lists the NVIDIA GPUs on the PCI bus from sysfs, without NVML: what the hardware
// holds, against which the GPUs NVML returns are compared. A GPU that is on the bus but that NVML
// cannot open (it failed to initialise, fell off the bus before the driver loaded, or is held
// by another driver) is capacity the node lost without any XID.
package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// NVIDIAVendor is NVIDIA's PCI vendor ID.
const NVIDIAVendor = 0x10de

// PCI classes of GPUs: display controllers, VGA-compatible (0x0300) and 3D (0x0302). NVSwitches
// (bridges, 0x0680) and NVIDIA's audio functions (0x0403) are not GPUs.
const (
	classVGA = 0x0300
	class3D  = 0x0302
)

// Function is one NVIDIA GPU function on the bus.
type Function struct {
	// Address is the function's address as sysfs names it, lower case: 0000:3b:00.0.
	Address string
	// Device is the PCI device ID (the GPU model).
	Device uint16
	// Class is the 24-bit PCI class code.
	Class uint32
}

// DefaultSysfsRoot is where sysfs is mounted.
const DefaultSysfsRoot = "/sys"

// GPUs returns the NVIDIA GPU functions under root's bus/pci/devices, sorted by address. A
// function whose vendor or class cannot be read is skipped: it is not known to be a GPU. A
// missing directory is an error (no sysfs: nothing can be compared).
func GPUs(root string) ([]Function, error) {
	dir := filepath.Join(root, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list PCI functions: %w", err)
	}
	var out []Function
	for _, e := range entries {
		addr := strings.ToLower(e.Name())
		if !ValidAddress(addr) {
			continue
		}
		vendor, err := readHex(filepath.Join(dir, e.Name(), "vendor"))
		if err != nil || vendor != NVIDIAVendor {
			continue
		}
		class, err := readHex(filepath.Join(dir, e.Name(), "class"))
		if err != nil || (class>>8 != classVGA && class>>8 != class3D) {
			continue
		}
		device, _ := readHex(filepath.Join(dir, e.Name(), "device"))
		out = append(out, Function{Address: addr, Device: uint16(device), Class: uint32(class)})
	}
	slices.SortFunc(out, func(a, b Function) int { return strings.Compare(a.Address, b.Address) })
	return out, nil
}

// readHex reads a sysfs attribute such as "0x10de\n"; values wider than 24 bits are refused.
func readHex(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	if len(b) > 32 {
		return 0, errors.New("attribute too long")
	}
	s := strings.TrimPrefix(strings.TrimSpace(string(b)), "0x")
	return strconv.ParseUint(s, 16, 24)
}

// ValidAddress reports whether s is a PCI function address in sysfs's form: domain (4 hex
// digits), bus and device (2), function (1 octal digit), as in 0000:3b:00.0.
func ValidAddress(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' {
		return false
	}
	for i, c := range s {
		switch i {
		case 4, 7, 10:
			continue
		case 11:
			if c < '0' || c > '7' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdef", c) {
				return false
			}
		}
	}
	return true
}

// Normalize turns a PCI bus ID in any of the forms NVML and the kernel write (00000000:3B:00.0,
// 0000:3b:00.0, 3b:00.0) into sysfs's 0000:3b:00.0; it reports false for anything else.
func Normalize(id string) (string, bool) {
	s, err := health.NormalizePCIBusID(id)
	return s, err == nil
}

// IsNotExist reports whether err says sysfs has no PCI bus to list (a container without /sys).
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
