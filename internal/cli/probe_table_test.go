package cli

import (
	"strings"
	"testing"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// gpuhealth probe's table shows the early-warning readings: the PCIe link against its maximum,
// the row remapper's banks, the SRAM ECC status, the fabric registration with its health mask
// (or without one, from a driver before 550) and the NVLink recovery counts.
func TestProbeTableShowsTheEarlyWarnings(t *testing.T) {
	mask := uint32(1)
	rep := gpunvml.Report{DriverVersion: "550.163.01", GPUs: []gpunvml.GPUReport{
		{Device: health.Device{UUID: "GPU-0", Index: 0}, Readings: gpunvml.Readings{
			PCIeLink:          &gpunvml.PCIeLinkReading{Gen: 5, MaxGen: 5, Width: 8, MaxWidth: 16},
			RowRemapHistogram: &gpunvml.RowRemapHistogramReading{Max: 637, Low: 2, None: 1},
			SRAM:              &gpunvml.SRAMReading{ThresholdExceeded: true, AggregateUncorrected: 4},
			Fabric:            &gpunvml.FabricReading{State: 3, Status: 999, HealthMask: &mask, DegradedBandwidth: true},
			NVLinks:           []gpunvml.NVLinkReading{{Link: 0}, {Link: 1}},
			NVLinkRecoveries:  []gpunvml.NVLinkRecoveryReading{{Link: 0, Successful: 3}, {Link: 1, Successful: 1, Failed: 1}},
		}},
		{Device: health.Device{UUID: "GPU-1", Index: 1}, Readings: gpunvml.Readings{
			PCIeLink: &gpunvml.PCIeLinkReading{Gen: 4, Width: 16},
			Fabric:   &gpunvml.FabricReading{State: 2},
		}},
	}}
	var out strings.Builder
	if err := writeProbeTable(&out, rep); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(strings.Fields(out.String()), " ") // the columns' widths are tabwriter's
	for _, want := range []string{
		"PCIe link: gen 5 x8 (the most it can here: gen 5 x16)",
		"row remapper banks: 637 with all spare rows, 0 high, 0 partial, 2 low, 1 none",
		"SRAM ECC: threshold exceeded true (aggregate: 4 uncorrected, 0 corrected)",
		"NVLink fabric: completed, status ", "(999), health: degradedBandwidth",
		"NVLink recoveries: 4 successful, 1 failed (lifetime, 2 links)",
		"PCIe link: gen 4 x16 (the most it can here: unknown)",
		"NVLink fabric: in progress, no health mask (a driver before 550)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("probe table lacks %q:\n%s", want, out.String())
		}
	}
}
