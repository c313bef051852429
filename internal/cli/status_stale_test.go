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

// TestStatusShowsStaleReportsAsUnknown: a node whose agent stopped sending heartbeats shows its
// GPUs as Unknown, saying since when and what the agent last said; a fresh heartbeat, and a node
// of an agent without heartbeats, show as reported; an unreadable heartbeat is stale.
func TestStatusShowsStaleReportsAsUnknown(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	node := func(name, heartbeat string) corev1.Node {
		n := gpuNodeObject("")
		n.Name = name
		if heartbeat != "" {
			n.Annotations[gpuhealthv1.HeartbeatKey] = heartbeat
		}
		return *n
	}
	nodes := []corev1.Node{
		node("fresh", gpuhealthv1.FormatHeartbeat(now.Add(-4*time.Minute))),
		node("stale", gpuhealthv1.FormatHeartbeat(now.Add(-20*time.Minute))),
		node("garbage", "yesterday"),
		node("old-agent", ""),
	}
	rows := collectStatus(nodes, klog.Background(), now, 15*time.Minute)
	for _, r := range rows {
		wantStale := r.Node == "stale" || r.Node == "garbage"
		if r.Stale != wantStale || (r.Health == HealthUnknown) != wantStale {
			t.Errorf("%s/%s: health %s, stale %v; want stale %v", r.Node, r.UUID, r.Health, r.Stale, wantStale)
		}
		if wantStale && r.ReportedHealth == "" {
			t.Errorf("%s/%s: the stopped agent's last word is lost", r.Node, r.UUID)
		}
		if (r.Heartbeat != nil) != (r.Node == "fresh" || r.Node == "stale") {
			t.Errorf("%s/%s: heartbeat %v", r.Node, r.UUID, r.Heartbeat)
		}
	}
	var table bytes.Buffer
	if err := writeStatusTable(&table, rows, false, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "Unknown (stale since 2026-12-02T11:40:00Z, was ") {
		t.Errorf("table:\n%s", table.String())
	}
	for _, r := range collectStatus(nodes, klog.Background(), now, 0) {
		if r.Stale {
			t.Errorf("--stale-after=0 still judges heartbeats: %s/%s", r.Node, r.UUID)
		}
	}
}
