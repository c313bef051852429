package health_test

import (
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestSetDrainsIsAuthoritative(t *testing.T) {
	devs := []health.Device{
		{UUID: "GPU-0", Index: 0}, {UUID: "GPU-1", Index: 1},
		{UUID: "MIG-1a", Index: 1, MIG: &health.MIGPlacement{ParentUUID: "GPU-1", GPUInstance: 1}},
	}
	tr, err := health.NewTracker(health.DefaultPolicy(), devs)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(0, 0)
	health0 := func() map[string]health.Severity {
		out := map[string]health.Severity{}
		for _, d := range tr.Snapshot().Devices {
			out[d.Device.UUID] = d.Health
		}
		return out
	}

	out, unknown := tr.SetDrains(map[string]string{"GPU-1": "drained by ops: fan noise", "GPU-x": "elsewhere"}, at, nil)
	if len(unknown) != 1 || unknown[0] != "GPU-x" {
		t.Errorf("unknown = %v, want [GPU-x]", unknown)
	}
	if len(out) != 2 { // GPU-1 and its MIG instance
		t.Errorf("transitions = %+v, want GPU-1 and MIG-1a to Unhealthy", out)
	}
	h := health0()
	if h["GPU-1"] != health.Unhealthy || h["MIG-1a"] != health.Unhealthy || h["GPU-0"] != health.Healthy {
		t.Errorf("health after drain = %v", h)
	}
	for _, c := range tr.Snapshot().Devices[1].Conditions {
		if c.Reason != health.ReasonAdminDrain || c.ClearsOn != health.ClearsOnAdmin || c.Message != "drained by ops: fan noise" {
			t.Errorf("drain condition = %+v", c)
		}
	}
	// A reset or a reboot does not end a drain.
	if _, err := tr.Observe(health.Signal{Kind: health.SignalReset, Device: "GPU-1", Time: at}, nil); err != nil {
		t.Fatal(err)
	}
	tr.Reboot("boot-2", at, nil)
	if h := health0(); h["GPU-1"] != health.Unhealthy {
		t.Errorf("a reset and a reboot ended the drain: %v", h)
	}
	// The same set again changes nothing.
	gen := tr.Generation()
	if out, _ := tr.SetDrains(map[string]string{"GPU-1": "drained by ops: fan noise"}, at, nil); len(out) != 0 || tr.Generation() != gen {
		t.Errorf("repeating the drains changed something: %+v", out)
	}
	// Only undrain (the GPU missing from the set) ends it.
	out, _ = tr.SetDrains(nil, at, nil)
	if len(out) != 2 || out[0].To != health.Healthy || out[0].Reason != health.ReasonAdminCleared {
		t.Errorf("undrain transitions = %+v", out)
	}
}
