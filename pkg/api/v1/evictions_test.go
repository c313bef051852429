package v1_test

import (
	"fmt"
	"reflect"
	"testing"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func TestEvictionsRoundTrip(t *testing.T) {
	var pods []gpuhealthv1.PodEviction
	for i := range gpuhealthv1.MaxEvictionPods + 2 {
		pods = append(pods, gpuhealthv1.PodEviction{Pod: fmt.Sprintf("ns/p%d", i), Via: "device-plugin", State: gpuhealthv1.EvictionDryRun})
	}
	v, err := gpuhealthv1.FormatEvictions(map[string]gpuhealthv1.GPUEvictions{"GPU-a": {Index: 1, Pods: pods}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := gpuhealthv1.ParseEvictions(v)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]gpuhealthv1.GPUEvictions{"GPU-a": {Index: 1, Pods: pods[:gpuhealthv1.MaxEvictionPods], More: 2}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip\n%+v\nwant\n%+v", got, want)
	}
	if s := got["GPU-a"].Short(); s == "-" || s[len(s)-4:] != "(+2)" {
		t.Fatalf("Short() = %q", s)
	}
	if v, _ := gpuhealthv1.FormatEvictions(nil); v != "" {
		t.Fatalf("nothing pending formats as %q, want empty", v)
	}
}

func TestParseEvictionsRejectsGarbage(t *testing.T) {
	if _, err := gpuhealthv1.ParseEvictions("{not json"); err == nil {
		t.Fatal("no error for a malformed annotation")
	}
	if m, err := gpuhealthv1.ParseEvictions(" "); err != nil || len(m) != 0 {
		t.Fatalf("empty value: %v, %v", m, err)
	}
}
