package v1_test

import (
	"strings"
	"testing"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func TestValidationRequestsRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	in := map[string]gpuhealthv1.ValidationRequest{"GPU-a": {Index: 2, Reason: "after RMA", By: "alice", At: at}}
	v, err := gpuhealthv1.FormatValidationRequests(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := gpuhealthv1.ParseValidationRequests(v)
	if err != nil || len(out) != 1 || out["GPU-a"] != in["GPU-a"] {
		t.Fatalf("round trip of %s: %+v %v", v, out, err)
	}
	if got, want := out["GPU-a"].Message(), "by alice at 2026-12-06T10:00:00Z: after RMA"; got != want {
		t.Errorf("Message() = %q, want %q", got, want)
	}
	if v, _ := gpuhealthv1.FormatValidationRequests(nil); v != "" {
		t.Errorf("no requests formatted as %q, want empty", v)
	}
}

func TestValidationRequestsRefuseBadInputWhole(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"not JSON", "{", "gpu-validation-requests"},
		{"a list", `[{"reason":"x"}]`, "cannot unmarshal"},
		{"no reason", `{"GPU-a":{"reason":"ok","by":"a"},"GPU-b":{"reason":" "}}`, "GPU-b: no reason"},
		{"empty UUID", `{"":{"reason":"x"}}`, "empty UUID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := gpuhealthv1.ParseValidationRequests(tc.value)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseValidationRequests(%q) = %v, %v; want an error with %q", tc.value, got, err, tc.want)
			}
		})
	}
	if got, err := gpuhealthv1.ParseValidationRequests("  "); err != nil || len(got) != 0 {
		t.Errorf("blank value: %v %v, want no requests", got, err)
	}
}
