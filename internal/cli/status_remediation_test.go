package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func TestStatusShowsRemediation(t *testing.T) {
	n := gpuNodeObject("")
	n.Annotations[gpuhealthv1.RemediationKey] = `{"GPU-b":{"phase":"Probation","since":"2026-11-29T23:59:00Z","attempts":1,"maxAttempts":3,"fault":"XID79"}}`
	rows := collectStatus([]corev1.Node{*n}, klog.Background(), time.Now(), 0)
	var table bytes.Buffer
	if err := writeStatusTable(&table, rows, false, time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(table.String(), "\n")
	if !strings.Contains(lines[0], "REMEDIATION") {
		t.Fatalf("header %q", lines[0])
	}
	for _, l := range lines[1:] {
		switch {
		case strings.Contains(l, "GPU-b") && !strings.HasSuffix(strings.TrimSpace(l), "Probation (1/3)"):
			t.Errorf("GPU-b row %q, want Probation (1/3)", l)
		case strings.Contains(l, "GPU-a") && !strings.HasSuffix(strings.TrimSpace(l), "-"):
			t.Errorf("GPU-a row %q, want -", l)
		}
	}
	// A malformed annotation is logged and ignored, the rows still show.
	n.Annotations[gpuhealthv1.RemediationKey] = "{"
	if rows := collectStatus([]corev1.Node{*n}, klog.Background(), time.Now(), 0); len(rows) == 0 || rows[0].Remediation != nil {
		t.Errorf("rows %+v", rows)
	}
}
