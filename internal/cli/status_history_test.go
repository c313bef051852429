package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func TestStatusShowsHistoryAndMissingGPUs(t *testing.T) {
	n := gpuNodeObject("")
	n.Annotations[gpuhealthv1.HealthKey] = `{"GPU-a":{"index":0,"health":"Unhealthy","reasons":["FaultReturnsAfterRepair"],` +
		`"history":{"faults":3,"resets":2,"reboots":0,"recent":[{"time":"2026-11-29T23:00:00Z","kind":"fault","reason":"XID48"}]}},` +
		`"MISSING-0000:07:00.0":{"index":-1,"pciBusID":"0000:07:00.0","health":"Unhealthy","reasons":["GPUMissing"],"missing":true}}`
	rows := collectStatus([]corev1.Node{*n}, klog.Background(), time.Now(), 0)
	var table bytes.Buffer
	if err := writeStatusTable(&table, rows, true, time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	out := table.String()
	if !strings.Contains(strings.Split(out, "\n")[0], "HISTORY") {
		t.Fatalf("wide header lacks HISTORY:\n%s", out)
	}
	for _, want := range []string{"3 faults, 2 resets, 0 reboots", "MISSING-0000:07:00.0", "GPUMissing"} {
		if !strings.Contains(out, want) {
			t.Errorf("wide table lacks %q:\n%s", want, out)
		}
	}
	b, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"history":{"faults":3,"resets":2,"reboots":0,"recent":[{"time":"2026-11-29T23:00:00Z","kind":"fault","reason":"XID48"}]}`) {
		t.Errorf("json lacks the history: %s", b)
	}
}

func TestStatusJSONSaysHowARepairedGPUWasJudged(t *testing.T) {
	n := gpuNodeObject("")
	n.Annotations[gpuhealthv1.HealthKey] = `{"GPU-a":{"index":0,"health":"Healthy","validation":{"at":"2026-12-06T10:00:00Z","result":"passed","by":"dcgm: dcgmi diag"}},` +
		`"GPU-b":{"index":1,"health":"Healthy","validation":{"at":"2026-12-06T10:00:00Z","result":"passive","by":"probation"}},"GPU-c":{"index":2,"health":"Healthy"}}`
	rows := collectStatus([]corev1.Node{*n}, klog.Background(), time.Now(), 0)
	b, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"validation":{"at":"2026-12-06T10:00:00Z","result":"passed","by":"dcgm: dcgmi diag"}`, `"result":"passive","by":"probation"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("json lacks %s: %s", want, b)
		}
	}
	if strings.Count(string(b), `"validation"`) != 2 {
		t.Errorf("a GPU never repaired has a validation: %s", b)
	}
}
