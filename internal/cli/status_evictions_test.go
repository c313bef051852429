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

func TestStatusShowsDryRunEvictions(t *testing.T) {
	n := gpuNodeObject("")
	n.Annotations[gpuhealthv1.EvictionsKey] = `{"GPU-b":{"index":1,"pods":[{"pod":"ml/train-0","via":"device-plugin","state":"DryRun"},{"pod":"ml/train-1","via":"volcano","state":"DryRun"}]}}`
	rows := collectStatus([]corev1.Node{*n}, klog.Background(), time.Now(), 0)
	var table bytes.Buffer
	if err := writeStatusTable(&table, rows, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(table.String(), "\n")
	if !strings.HasSuffix(strings.TrimSpace(lines[0]), "EVICTIONS") {
		t.Fatalf("header %q", lines[0])
	}
	found := false
	for _, l := range lines[1:] {
		if strings.Contains(l, "GPU-b") {
			found = strings.HasSuffix(strings.TrimSpace(l), "DryRun: ml/train-0,ml/train-1")
		}
	}
	if !found {
		t.Fatalf("no GPU-b row listing its dry-run evictions:\n%s", table.String())
	}
	n.Annotations[gpuhealthv1.EvictionsKey] = "{"
	if rows := collectStatus([]corev1.Node{*n}, klog.Background(), time.Now(), 0); len(rows) == 0 || rows[0].Evictions != nil {
		t.Errorf("a malformed annotation: rows %+v", rows)
	}
}
