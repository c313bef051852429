package health

import (
	"fmt"
	"strconv"
	"strings"
)

// NormalizePCIBusID returns a PCI address (Device.PCIBusID) in the extended BDF form that
// Kubernetes' standard attribute resource.kubernetes.io/pciBusID and sysfs use: "0000:3b:00.0",
// lower case, a domain of at least four hexadecimal digits (a VMD domain has five). It accepts
// NVML's form with an eight-digit domain ("00000000:3B:00.0") and a short one without a domain
// ("3b:00.0"), and refuses anything outside the PCI ranges (bus 0-ff, device 0-1f, function 0-7,
// domain 32 bits). It is the one normaliser of bus IDs: the inventory, sysfs, DRA devices, the
// kernel log and the tools all compare addresses through it.
func NormalizePCIBusID(s string) (string, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return "", fmt.Errorf("PCI address %q: want domain:bus:device.function", s)
	}
	devStr, fnStr, ok := strings.Cut(parts[2], ".")
	if !ok {
		return "", fmt.Errorf("PCI address %q: want domain:bus:device.function", s)
	}
	var v [4]uint64
	for i, f := range []struct {
		text string
		bits int
	}{{parts[0], 32}, {parts[1], 8}, {devStr, 5}, {fnStr, 3}} {
		n, err := strconv.ParseUint(f.text, 16, f.bits)
		if err != nil || f.text == "" || len(f.text) > 8 {
			return "", fmt.Errorf("PCI address %q: %q is not a hexadecimal number of at most %d bits", s, f.text, f.bits)
		}
		v[i] = n
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3]), nil
}
