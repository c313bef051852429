package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

const healthJSON = `{"GPU-a":{"index":0,"pciBusID":"00000000:10:00.0","model":"H100","health":"Healthy"},
"GPU-b":{"index":1,"pciBusID":"00000000:11:00.0","model":"H100","health":"Unhealthy","reasons":["XID79"],"since":"2026-11-30T00:00:00Z"},
"MIG-b1":{"index":1,"health":"Unhealthy","parentUUID":"GPU-b"}}`

func gpuNodeObject(drains string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{gpuhealthv1.HealthKey: healthJSON}}}
	if drains != "" {
		n.Annotations[gpuhealthv1.DrainsKey] = drains
	}
	return n
}

func TestResolveGPU(t *testing.T) {
	for _, tc := range []struct {
		name, gpu, wantUUID string
		wantIndex           int
		wantErr             string
	}{
		{"by index", "1", "GPU-b", 1, ""},
		{"by UUID, any case", "gpu-a", "GPU-a", 0, ""},
		{"by PCI bus ID with a short domain", "0000:11:00.0", "GPU-b", 1, ""},
		{"unknown index", "7", "", 0, "no GPU \"7\""},
		{"a UUID the agent has not reported", "GPU-new", "GPU-new", -1, ""},
		{"garbage", "x!", "", 0, "no GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uuid, index, err := resolveGPU(gpuNodeObject(""), map[string]gpuhealthv1.Drain{}, tc.gpu)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || uuid != tc.wantUUID || index != tc.wantIndex {
				t.Errorf("resolveGPU(%q) = %q, %d, %v; want %q, %d", tc.gpu, uuid, index, err, tc.wantUUID, tc.wantIndex)
			}
		})
	}
	if _, _, err := resolveGPU(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}, nil, "0"); err == nil || !strings.Contains(err.Error(), "is the gpuhealth agent running") {
		t.Errorf("a node without the agent's annotation: err = %v", err)
	}
}

func TestStatusRowsAndTable(t *testing.T) {
	drains := `{"GPU-a":{"index":0,"reason":"fan noise","by":"alice","at":"2026-11-29T00:00:00Z"},"GPU-gone":{"index":5,"reason":"RMA","by":"bob"}}`
	nodes := []corev1.Node{*gpuNodeObject(drains), {ObjectMeta: metav1.ObjectMeta{Name: "n0-bad", Annotations: map[string]string{gpuhealthv1.HealthKey: "{not json"}}}}
	rows := collectStatus(nodes, klog.Background(), time.Now(), 0)
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4 (two GPUs, a MIG instance, a drain for a GPU not reported): %+v", len(rows), rows)
	}
	a := rows[0]
	if a.UUID != "GPU-a" || !a.Drained || a.Health != "Unhealthy" || a.Reasons[0] != "AdminDrain" || a.DrainedBy != "alice" || a.Since == nil {
		t.Errorf("drained GPU row = %+v", a)
	}
	if gone := rows[3]; gone.UUID != "GPU-gone" || gone.Health != "Unhealthy" || !gone.Drained || gone.Model != "" {
		t.Errorf("drain without a report = %+v", gone)
	}
	var table, wide bytes.Buffer
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	if err := writeStatusTable(&table, rows, false, now); err != nil {
		t.Fatal(err)
	}
	if err := writeStatusTable(&wide, rows, true, now); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(table.String(), "MIG-b1") || !strings.Contains(wide.String(), "MIG-b1") {
		t.Errorf("MIG instances belong in -o wide only:\n%s\n%s", table.String(), wide.String())
	}
	if !strings.Contains(table.String(), "XID79") || !strings.Contains(table.String(), "24h") || !strings.Contains(wide.String(), "fan noise") {
		t.Errorf("table:\n%s\nwide:\n%s", table.String(), wide.String())
	}
}

func TestNormalizeBusID(t *testing.T) {
	if normalizeBusID("00000000:3B:00.0") != normalizeBusID("0000:3b:00.0") {
		t.Error("bus IDs with 8 and 4 domain digits differ")
	}
}
