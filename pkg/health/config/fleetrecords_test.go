package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestRecordsAndRepeatOffenderParse(t *testing.T) {
	c := mustParse(t, "")
	if c.Fleet.Records.IsEnabled() || c.Fleet.RepeatOffender != nil {
		t.Fatalf("default: records %v, repeat offender %+v; want both off", c.Fleet.Records.IsEnabled(), c.Fleet.RepeatOffender)
	}
	c = mustParse(t, "fleet:\n  records: {enabled: true, maxRecords: 1000}\n  repeatOffender: {faults: 3, within: 720h, replaceGPU: true}\n")
	r := c.Fleet.RepeatOffender
	if !c.Fleet.Records.IsEnabled() || *c.Fleet.Records.MaxRecords != 1000 || r.Faults != 3 || r.Window() != 720*time.Hour || !r.ReplaceGPU {
		t.Fatalf("parsed %+v, %+v", c.Fleet.Records, r)
	}
	mustParse(t, "fleet:\n  repeatOffender: {replaceGPU: true}\n")
}

func TestRepeatOffenderValidation(t *testing.T) {
	for _, tc := range []struct{ name, body, path, detail string }{
		{"faults without a window", "repeatOffender: {faults: 3}", "fleet.repeatOffender.within", "required"},
		{"a rule that finds nothing", "repeatOffender: {within: 24h}", "fleet.repeatOffender", "finds nothing"},
		{"negative faults", "repeatOffender: {faults: -1, within: 24h}", "fleet.repeatOffender.faults", "from 0 to 64"},
		{"more faults than a record keeps", "repeatOffender: {faults: 65, within: 24h}", "fleet.repeatOffender.faults", "from 0 to 64"},
		{"a zero window", "repeatOffender: {faults: 2, within: 0s}", "fleet.repeatOffender.within", "positive"},
		{"a window of ten years", "repeatOffender: {faults: 2, within: 87600h}", "fleet.repeatOffender.within", "at most"},
		{"no records allowed", "records: {maxRecords: 0}", "fleet.records.maxRecords", "1 or more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(header + "fleet:\n  " + tc.body + "\n"))
			if err == nil {
				t.Fatal("parsed; want an error")
			}
			if got, ok := detailsByPath(err)[tc.path]; !ok || !strings.Contains(got, tc.detail) {
				t.Errorf("error %v, want %s: ...%s...", err, tc.path, tc.detail)
			}
		})
	}
	if _, err := config.Parse([]byte(header + "fleet:\n  repeatOffender: {faultz: 3}\n")); err == nil || !strings.Contains(err.Error(), "faultz") {
		t.Errorf("an unknown field: %v", err)
	}
}
