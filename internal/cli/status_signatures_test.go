package cli

import (
	"slices"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
	"github.com/gpuhealth/gpuhealth/internal/fleet/watch"
)

func TestStatusMarksTheGPUsOfAWorkloadSignature(t *testing.T) {
	gpus := []GPUStatus{{UUID: "GPU-a", Reasons: []string{"XID45"}}, {UUID: "GPU-b"}, {UUID: "GPU-c", Reasons: []string{"XID79"}}}
	markSignatures(gpus, []watch.Signature{{Signature: sharedcause.Signature{Workload: "podgroup/ml/job-1", Reason: "XID45", GPUs: []string{"GPU-a", "GPU-b"}}, SpannedGPUs: 2}})
	if gpus[0].WorkloadSignature != "podgroup/ml/job-1" || !slices.Equal(gpus[0].Reasons, []string{"XID45", "signature:podgroup/ml/job-1"}) ||
		gpus[1].WorkloadSignature != "podgroup/ml/job-1" || gpus[2].WorkloadSignature != "" || len(gpus[2].Reasons) != 1 {
		t.Fatalf("rows %+v", gpus)
	}
}
