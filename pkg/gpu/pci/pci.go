// Package pci lists the NVIDIA GPUs on the PCI bus from sysfs, without NVML: what the hardware
// holds, against which the GPUs NVML returns are compared. A GPU that is on the bus but that NVML
// cannot open (it failed to initialise, fell off the bus before the driver loaded, or NVIDIA's
// driver failed to bind it) is capacity the node lost without any XID. A GPU bound to another
// driver on purpose (vfio-pci for a virtual machine) is listed with that driver, so that the
// caller can leave it out.
//
// sysfs is read as input that crosses a boundary: the agent reads a host path mounted into its
// container, and what sits there is not always the kernel's. Only regular files are read, never
// more than a few bytes of each, and nothing read can block (attribute.go).
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

// NVIDIADriver is the name NVIDIA's kernel driver binds GPUs under, the proprietary and the open
// kernel modules alike.
const NVIDIADriver = "nvidia"

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
	// Device is the PCI device ID (the GPU model); 0 when it cannot be read.
	Device uint16
	// Class is the 24-bit PCI class code.
	Class uint32
	// Driver is the kernel driver the function is bound to, as its driver link names it
	// ("nvidia", "vfio-pci"); empty when none is.
	Driver string
}

// OtherDriver reports whether the function is bound to a driver other than NVIDIA's: handed to
// a virtual machine (vfio-pci: KubeVirt, Kata), or taken by nouveau. An unbound function is not:
// NVIDIA's driver failed to bind it.
func (f Function) OtherDriver() bool { return f.Driver != "" && f.Driver != NVIDIADriver }

// Skipped is a function GPUs could not read: not known to be a GPU, or a GPU whose driver is not
// known.
type Skipped struct {
	// Address is the function's address, lower case.
	Address string
	// Err says what could not be read, and why.
	Err error
}

// DefaultSysfsRoot is where sysfs is mounted.
const DefaultSysfsRoot = "/sys"

// GPUs returns the NVIDIA GPU functions under root's bus/pci/devices, sorted by address, and the
// functions it skipped with the reason: one whose vendor or class cannot be read is not known to
// be a GPU, one whose driver link cannot be read is not known to be NVIDIA's or another's. A
// missing directory is an error (no sysfs: nothing can be compared).
func GPUs(root string) ([]Function, []Skipped, error) {
	dir := filepath.Join(root, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list PCI functions: %w", err)
	}
	var out []Function
	var skipped []Skipped
	for _, e := range entries {
		addr := strings.ToLower(e.Name())
		if !ValidAddress(addr) {
			continue
		}
		f, gpu, err := readFunction(filepath.Join(dir, e.Name()), addr)
		switch {
		case err != nil:
			skipped = append(skipped, Skipped{Address: addr, Err: err})
		case gpu:
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b Function) int { return strings.Compare(a.Address, b.Address) })
	return out, skipped, nil
}

// readFunction reads the function in dir: whether it is an NVIDIA GPU and, when it is, its
// device ID and driver.
func readFunction(dir, addr string) (Function, bool, error) {
	vendor, err := readHex(filepath.Join(dir, "vendor"))
	if err != nil {
		return Function{}, false, fmt.Errorf("vendor: %w", err)
	}
	if vendor != NVIDIAVendor {
		return Function{}, false, nil
	}
	class, err := readHex(filepath.Join(dir, "class"))
	if err != nil {
		return Function{}, false, fmt.Errorf("class: %w", err)
	}
	if class>>8 != classVGA && class>>8 != class3D {
		return Function{}, false, nil
	}
	driver, err := readDriver(dir)
	if err != nil {
		return Function{}, false, err
	}
	device, _ := readHex(filepath.Join(dir, "device")) // the model is said, never judged
	return Function{Address: addr, Device: uint16(device), Class: uint32(class), Driver: driver}, true, nil
}

// readDriver is the name of the driver the function in dir is bound to: the last element of its
// driver link, empty when there is none (unbound).
func readDriver(dir string) (string, error) {
	target, err := os.Readlink(filepath.Join(dir, "driver"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("driver: %w", err)
	}
	name := filepath.Base(target)
	if !validDriverName(name) {
		return "", fmt.Errorf("driver: the link names no driver: %.80q", name)
	}
	return name, nil
}

// maxDriverName bounds a driver's name: the kernel's module names are shorter (MODULE_NAME_LEN
// is 56), and the name goes into log lines and Events.
const maxDriverName = 64

// validDriverName reports whether s can be a kernel driver's name: letters, digits, '_', '-' and
// '.', at most maxDriverName of them.
func validDriverName(s string) bool {
	if s == "" || len(s) > maxDriverName || s == "." || s == ".." {
		return false
	}
	return strings.IndexFunc(s, func(c rune) bool {
		return !strings.ContainsRune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.", c)
	}) < 0
}

// readHex reads a sysfs attribute such as "0x10de\n"; values wider than 24 bits are refused.
func readHex(path string) (uint64, error) {
	b, err := readAttribute(path)
	if err != nil {
		return 0, err
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
