package report_test

import (
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/report"
)

func TestLastValueChanged(t *testing.T) {
	var l report.LastValue
	for i, tc := range []struct {
		v    string
		want bool
	}{
		{"", false}, // the zero value holds ""
		{"a", true},
		{"a", false},
		{"b", true},
		{"", true},
	} {
		if got := l.Changed(tc.v); got != tc.want {
			t.Errorf("step %d: Changed(%q) = %v, want %v", i, tc.v, got, tc.want)
		}
	}
}
