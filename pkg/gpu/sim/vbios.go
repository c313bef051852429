package sim

import (
	"errors"
	"fmt"
)

// VBIOS versions: the video BIOS a node's boards were flashed with, usually one for all of them.
// The simulated driver's nvmlDeviceGetVbiosVersion and the sim backend's health.Device answer
// Scenario.VBIOS.

// DefaultVBIOS is the VBIOS version of every simulated GPU when the scenario gives none
// (gpus.vbios): an H100 SXM's, in NVIDIA's format.
const DefaultVBIOS = "96.00.89.00.01"

// MaxVBIOSLength bounds the VBIOS version a scenario gives: NVML's
// NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE is 32 bytes with the terminating NUL, so no board's
// version is longer, and a longer one would not pass through the simulated driver's
// nvmlDeviceGetVbiosVersion.
const MaxVBIOSLength = 31

// parseVBIOS reads gpus.vbios: absent, every GPU has DefaultVBIOS; given, it must be a version a
// board could report (NVML's length, printable ASCII, no space).
func (sc *Scenario) parseVBIOS(vbios *string) error {
	sc.VBIOS = DefaultVBIOS
	if vbios == nil {
		return nil
	}
	if err := checkVBIOS(*vbios); err != nil {
		return fmt.Errorf("gpus.vbios: %w", err)
	}
	sc.VBIOS = *vbios
	return nil
}

// checkVBIOS says what makes v a VBIOS version no board reports.
func checkVBIOS(v string) error {
	if v == "" {
		return errors.New("must not be empty (leave it out: the GPUs take the default, " + DefaultVBIOS + ")")
	}
	if len(v) > MaxVBIOSLength {
		return fmt.Errorf("%.40q has %d characters, at most %d", v, len(v), MaxVBIOSLength)
	}
	for i := range len(v) {
		if c := v[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%q has %q: only printable ASCII, no space", v, c)
		}
	}
	return nil
}
