package kmsg

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// runtimeWithSource runs a health.Runtime saving to path, and a Source over reads feeding its
// Monitor, until the Source has read n records and the checkpoint's cursor reached seq.
func runtimeWithSource(t *testing.T, path string, n, seq uint64, reads ...fakeRead) *health.Runtime {
	t.Helper()
	rt, err := health.NewRuntime(health.DefaultPolicy(), inventory(), health.RuntimeOptions{CheckpointPath: path, BootID: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Restore(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx, nil) }()
	runSource(t, rt.Monitor(), SourceOptions{BootID: "b1"}, n, reads...)
	deadline := time.Now().Add(safetyNet)
	for {
		cp, err := health.ReadCheckpoint(path)
		if err == nil && cp.Cursors[SourceName].Seq == seq {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoint never reached seq %d: %+v, %v", seq, cp.Cursors, err)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return rt
}

func xids(rt *health.Runtime, uuid string) map[uint32]uint64 {
	got := map[uint32]uint64{}
	for _, d := range rt.Monitor().Tracker().Snapshot().Devices {
		if d.Device.UUID == uuid {
			for _, x := range d.XIDs {
				got[x.XID] = x.Count
			}
		}
	}
	return got
}

func healthOf(rt *health.Runtime, uuid string) health.Severity {
	for _, d := range rt.Monitor().Tracker().Snapshot().Devices {
		if d.Device.UUID == uuid {
			return d.Health
		}
	}
	return health.Healthy
}

// An agent restart in the middle of a boot: the second process replays the same ring buffer,
// applies only what the first did not, and keeps what the first applied.
func TestRestartNeitherLosesNorDoubleAppliesKernelLogXIDs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	first := []fakeRead{
		kernel(1, 1, "pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200"),
		kernel(2, 10, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
		kernel(3, 11, "NVRM: Xid (PCI:0000:86:00): 13, pid=1, name=a, Graphics Exception"),
	}
	rt := runtimeWithSource(t, path, 3, 3, first...)
	if got := xids(rt, "GPU-bbbb")[13]; got != 1 {
		t.Fatalf("first run: XID 13 counted %d times, want 1", got)
	}

	// While the agent was down, the driver logged two more records; the buffer still holds all.
	second := append(first,
		kernel(4, 20, "usb 1-1: new high-speed USB device number 2"),
		kernel(5, 21, "NVRM: Xid (PCI:0000:86:00): 13, pid=2, name=b, Graphics Exception"),
	)
	rt = runtimeWithSource(t, path, 5, 5, second...)
	if got := healthOf(rt, "GPU-aaaa"); got != health.Unhealthy {
		t.Errorf("GPU-aaaa after the restart is %v, want Unhealthy (XID 79 from the checkpoint)", got)
	}
	// XID counts are not checkpointed: what the second run counted is what it applied.
	if got := xids(rt, "GPU-aaaa")[79]; got != 0 {
		t.Errorf("XID 79 applied again after the restart (%d times)", got)
	}
	if got := xids(rt, "GPU-bbbb")[13]; got != 1 {
		t.Errorf("XID 13 counted %d times after the restart, want 1 (the one logged while down)", got)
	}
}
