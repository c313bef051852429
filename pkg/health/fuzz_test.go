package health_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// FuzzUnmarshalCheckpoint feeds arbitrary bytes to the checkpoint decoder and whatever it accepts
// to a Tracker. Nothing may panic; every rejection wraps ErrCorruptCheckpoint and is one line.
func FuzzUnmarshalCheckpoint(f *testing.F) {
	valid := validCheckpointBytes(f)
	f.Add(valid)
	f.Add(valid[:len(valid)/3])
	f.Add([]byte{})
	f.Add([]byte("{}"))
	f.Add([]byte(`{"version":1,"checksum":"sha256:","data":{}}`))
	f.Add([]byte(`{"version":2,"checksum":"sha256:00","data":null}`))
	for _, cp := range []health.Checkpoint{
		{},
		{BootID: "b", Devices: []health.CheckpointedDevice{{Device: health.Device{UUID: "GPU-x"}}}},
		{BootID: "b", Devices: []health.CheckpointedDevice{{
			Device:     migDevice(7, 1, 0),
			Conditions: []health.Condition{{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy, ClearsOn: health.ClearsOnAdmin}},
		}}},
		{BootID: "b", Devices: []health.CheckpointedDevice{{
			Device:     gpuDevice(0),
			Conditions: []health.Condition{{Severity: health.Unhealthy, ClearsOn: health.ClearsOnQuietPeriod}},
		}}},
	} {
		b, err := health.MarshalCheckpoint(cp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cp, err := health.UnmarshalCheckpoint(b)
		if err != nil {
			if !errors.Is(err, health.ErrCorruptCheckpoint) {
				t.Fatalf("error %v does not wrap ErrCorruptCheckpoint", err)
			}
			if msg := err.Error(); msg == "" || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("error %q is not one non-empty line", msg)
			}
			return
		}
		for _, bootID := range []string{cp.BootID, cp.BootID + "-next"} {
			tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{gpuDevice(0), migDevice(0, 1, 0)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tr.Restore(cp, bootID, t0, nil); err != nil && !errors.Is(err, health.ErrCorruptCheckpoint) {
				t.Fatalf("Restore: %v does not wrap ErrCorruptCheckpoint", err)
			}
			// Whatever was restored, the tracker keeps working.
			for _, d := range tr.Snapshot().Devices {
				if _, err := tr.Observe(health.Signal{Kind: health.SignalReset, Device: d.Device.UUID, Time: t0}, nil); err != nil {
					t.Fatal(err)
				}
			}
			tr.Tick(t0.Add(24*time.Hour), nil)
			tr.Reboot("again", t0.Add(25*time.Hour), nil)
			if _, err := health.MarshalCheckpoint(tr.Checkpoint()); err != nil {
				t.Fatalf("a restored tracker's checkpoint does not encode: %v", err)
			}
		}
	})
}
