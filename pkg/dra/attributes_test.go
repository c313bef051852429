package dra_test

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
)

func TestAttributesValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		attrs dra.Attributes
		err   []string // substrings; none means valid
	}{
		{"the defaults", dra.DefaultAttributes(), nil},
		{"empty names", dra.Attributes{}, []string{"uuidAttribute: must not be empty", "parentUUIDAttribute: must not be empty", "pciBusIDAttribute: must not be empty"}},
		{"qualified names", dra.Attributes{UUID: "gpu.nvidia.com/uuid", ParentUUID: "parentUUID", PCIBusID: "resource.kubernetes.io/pciBusID"}, nil},
		{"not a C identifier", dra.Attributes{UUID: "gpu-uuid", ParentUUID: "parentUUID", PCIBusID: "bus"}, []string{`uuidAttribute: "gpu-uuid"`}},
		{"a bad domain", dra.Attributes{UUID: "uuid", ParentUUID: "Not_A_Domain/parent", PCIBusID: "bus"}, []string{"parentUUIDAttribute", "DNS subdomain"}},
		{"too long", dra.Attributes{UUID: strings.Repeat("u", 33), ParentUUID: "parentUUID", PCIBusID: "bus"}, []string{"at most 32 characters"}},
		{"the same name twice", dra.Attributes{UUID: "uuid", ParentUUID: "uuid", PCIBusID: "bus"}, []string{"parentUUIDAttribute", "already uuidAttribute"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.attrs.Validate()
			if len(tc.err) == 0 {
				if err != nil {
					t.Errorf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want an error about %v", tc.err)
			}
			for _, want := range tc.err {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate = %q, want it to say %q", err, want)
				}
			}
		})
	}
	if got := (dra.Attributes{ParentUUID: "owner"}).WithDefaults(); got != (dra.Attributes{UUID: "uuid", ParentUUID: "owner", PCIBusID: "resource.kubernetes.io/pciBusID"}) {
		t.Errorf("WithDefaults = %+v", got)
	}
}

func TestNormalizePCIBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0", // NVML
		"0000:3b:00.0":     "0000:3b:00.0", // the standard attribute
		"3b:00.0":          "0000:3b:00.0",
		"0001:DB:1f.7":     "0001:db:1f.7",
		"10000:01:00.0":    "10000:01:00.0", // a VMD domain
		"":                 "",
		"0000:3b:00":       "",
		"0000:3b:20.0":     "", // device numbers end at 1f
		"0000:3b:00.8":     "", // functions end at 7
		"0000:100:00.0":    "",
		"x:y:z.w":          "",
		"0000:3b:00.0:1":   "",
		"0000:-1:00.0":     "",
		"0000:+1:00.0":     "",
	} {
		got, err := dra.NormalizePCIBusID(in)
		if want == "" && err == nil || want != "" && (err != nil || got != want) {
			t.Errorf("NormalizePCIBusID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
