package agent

import (
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestConditionFromReason(t *testing.T) {
	p := health.DefaultPolicy()
	since := time.Unix(100, 0)
	for _, tc := range []struct {
		reason   string
		ok       bool
		clearsOn health.ClearsOn
		evict    bool
	}{
		{"XID79", true, health.ClearsOnNodeReboot, true},
		{"XID48", true, health.ClearsOnGPUReset, false},
		{"XID13", false, 0, false},  // application error: nothing to restore
		{"XID154", false, 0, false}, // follows the recovery action, which is read again
		{"GPULost", true, health.ClearsOnNodeReboot, true},
		{"TemperatureAtShutdown", false, 0, false}, // a polled reading comes back by itself
		{"XIDnope", false, 0, false},
	} {
		c, ok := conditionFromReason(p, tc.reason, since)
		if ok != tc.ok || (ok && (c.ClearsOn != tc.clearsOn || c.Evict != tc.evict || !c.Since.Equal(since) || c.Reason != tc.reason)) {
			t.Errorf("%s: %+v, %v", tc.reason, c, ok)
		}
	}
}

func TestReadBootTime(t *testing.T) {
	bt, err := ReadBootTime()
	if err != nil {
		t.Skipf("no /proc/stat here: %v", err)
	}
	if !bt.Before(time.Now()) || bt.Before(time.Unix(0, 0).Add(time.Hour)) {
		t.Errorf("boot time %v is not plausible", bt)
	}
}
