package watch

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
)

// bigResult is a judgement with n findings and n signatures of gpus GPUs each, names padded to
// pad characters.
func bigResult(n, gpus, pad int) sharedcause.Result {
	res := sharedcause.Result{Now: t0, Window: 3600e9, GPUs: 400_000}
	for i := range n {
		res.SharedCauses = append(res.SharedCauses, sharedcause.Finding{Attribute: "example.com/rack", Value: fmt.Sprintf("r%d%s", i, strings.Repeat("x", pad)),
			FaultyGPUs: 9, GPUs: 64, Reasons: []sharedcause.ReasonCount{{Reason: "XID79", Faults: 9}}})
		s := sharedcause.Signature{Workload: fmt.Sprintf("job/ns/train-%d%s", i, strings.Repeat("y", pad)), Reason: "XID45", WorkloadGPUs: gpus, Faults: gpus}
		for g := range gpus {
			s.GPUs = append(s.GPUs, gpuUUID(i, g))
		}
		res.Signatures = append(res.Signatures, s)
	}
	return res
}

func TestFindingsAreBounded(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		res                   sharedcause.Result
		causes, sigs, sigGPUs int
	}{
		{"a quiet fleet", sharedcause.Result{Now: t0}, 0, 0, 0},
		{"few", bigResult(3, 8, 0), 3, 3, 8},
		{"more than the caps", bigResult(150, 100, 0), MaxSharedCauses, MaxSignatures, MaxSignatureGPUs},
		// Names that no cap on counts bounds (a workload's name, a label's value as an agent wrote
		// them): the bytes' cap leaves out signatures, then findings.
		{"long names", bigResult(150, 4, 4000), -1, -1, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFindings(tc.res, 0, false)
			data, err := f.encode()
			if err != nil {
				t.Fatal(err)
			}
			if len(data) > MaxFindingsBytes {
				t.Errorf("%d bytes, more than %d", len(data), MaxFindingsBytes)
			}
			if tc.sigs < 0 { // left out for their bytes
				if f.SignaturesLeftOut <= len(tc.res.Signatures)-MaxSignatures {
					t.Errorf("%d signatures left out, want more than the cap leaves out", f.SignaturesLeftOut)
				}
			} else if len(f.SharedCauses) != tc.causes || len(f.Signatures) != tc.sigs {
				t.Errorf("%d findings and %d signatures, want %d and %d", len(f.SharedCauses), len(f.Signatures), tc.causes, tc.sigs)
			}
			if f.SharedCausesLeftOut+len(f.SharedCauses) != len(tc.res.SharedCauses) || f.SignaturesLeftOut+len(f.Signatures) != len(tc.res.Signatures) {
				t.Errorf("left out %d findings and %d signatures of %d and %d: they must add up", f.SharedCausesLeftOut, f.SignaturesLeftOut,
					len(tc.res.SharedCauses), len(tc.res.Signatures))
			}
			for _, s := range f.Signatures {
				if len(s.GPUs) != tc.sigGPUs || s.SpannedGPUs != len(tc.res.Signatures[0].GPUs) {
					t.Errorf("a signature names %d GPUs of %d, want %d", len(s.GPUs), s.SpannedGPUs, tc.sigGPUs)
				}
			}
			back, err := ParseFindings(&corev1.ConfigMap{Data: map[string]string{FindingsKey: string(data)}})
			if err != nil {
				t.Fatal(err)
			}
			if !sameVerdict(back, f) || !back.JudgedAt.Equal(t0) {
				t.Errorf("read back %+v, want %+v", back, f)
			}
		})
	}
	if _, err := ParseFindings(&corev1.ConfigMap{}); err == nil {
		t.Error("ParseFindings of a ConfigMap without findings: no error")
	}
}
