package kmsg

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// runningCompanion is a Runtime saving to a checkpoint, and a Companion reading a relay into it
// beside a backend that does nothing, until stop.
type runningCompanion struct {
	rt   *health.Runtime
	k    *Companion
	stop func()
}

func startCompanion(t *testing.T, ctx context.Context, checkpoint, socket string) *runningCompanion {
	t.Helper()
	rt, err := health.NewRuntime(health.DefaultPolicy(), inventory(), health.RuntimeOptions{CheckpointPath: checkpoint, BootID: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Restore(); err != nil {
		t.Fatal(err)
	}
	k := OpenCompanion(ctx, CompanionOptions{RelaySocket: socket, Devices: inventory(), BootID: "b1", startWait: 10 * time.Millisecond})
	k.backoffInitial, k.backoffMax = time.Millisecond, 4*time.Millisecond
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- rt.Run(ctx, func(ctx context.Context, m *health.Monitor) error {
			return k.Run(ctx, m, func(ctx context.Context) error { <-ctx.Done(); return nil })
		})
	}()
	c := &runningCompanion{rt: rt, k: k}
	c.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		_ = k.Close()
	}
	return c
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(safetyNet); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

func cursorAt(path string, seq uint64) func() bool {
	return func() bool {
		cp, err := health.ReadCheckpoint(path)
		return err == nil && cp.Cursors[SourceName].Seq == seq
	}
}

// A relay that is not there yet is one warning and the source down; the Companion connects by
// itself once the relay listens, and reads from it.
func TestCompanionWaitsForTheRelay(t *testing.T) {
	var l healthtest.Log
	socket := socketPath(t)
	c := startCompanion(t, l.Context(), filepath.Join(t.TempDir(), "ckpt.json"), socket)
	defer c.stop()
	if c.k.Up() {
		t.Error("up with no relay")
	}
	warned := l.Containing("Warning: the kernel log is not read", socket, "kmsg-relay container")
	if len(warned) != 1 {
		t.Errorf("logged %q, want one warning naming the relay and the hint", l.Lines())
	}
	r := startRelay(t, socket, RelayOptions{BootID: "b1"})
	r.feed.send(rec(7, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus."))
	waitFor(t, "GPU-aaaa Unhealthy from the relayed XID 79", func() bool { return healthOf(c.rt, "GPU-aaaa") == health.Unhealthy })
	if !c.k.Up() || len(l.Containing("Reading the kernel log again")) == 0 {
		t.Errorf("up %v, logged %q", c.k.Up(), l.Lines())
	}
}

// Either side may restart: a relay that comes back reads the kernel's buffer again and hands
// out every record, and the agent applies only those after its cursor; an agent that comes
// back does the same from its checkpoint. Nothing is lost and nothing counted twice.
func TestRelayOrAgentRestartNeitherLosesNorDoubleApplies(t *testing.T) {
	var l healthtest.Log
	socket, checkpoint := socketPath(t), filepath.Join(t.TempDir(), "ckpt.json")
	buffer := []Record{
		rec(1, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.163.01"),
		rec(2, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
		rec(3, "NVRM: Xid (PCI:0000:86:00): 13, pid=1, name=a, Graphics Exception"),
	}
	relay := startRelay(t, socket, RelayOptions{BootID: "b1"})
	relay.feed.send(buffer...)
	agent := startCompanion(t, l.Context(), checkpoint, socket)
	waitFor(t, "the cursor at 3", cursorAt(checkpoint, 3))
	if got := xids(agent.rt, "GPU-bbbb")[13]; got != 1 {
		t.Fatalf("XID 13 counted %d times, want 1", got)
	}

	// The relay restarts; meanwhile the driver logs another XID 13.
	relay.stop()
	waitFor(t, "the source down without its relay", func() bool { return !agent.k.Up() })
	buffer = append(buffer, rec(4, "NVRM: Xid (PCI:0000:86:00): 13, pid=2, name=b, Graphics Exception"))
	relay = startRelay(t, socket, RelayOptions{BootID: "b1"})
	relay.feed.send(buffer...)
	waitFor(t, "the cursor at 4", cursorAt(checkpoint, 4))
	if got, x79 := xids(agent.rt, "GPU-bbbb")[13], xids(agent.rt, "GPU-aaaa")[79]; got != 2 || x79 != 1 {
		t.Errorf("after the relay's restart: XID 13 counted %d times, XID 79 %d; want 2 and 1", got, x79)
	}

	// The agent restarts; the driver logs one more.
	agent.stop()
	relay.feed.send(rec(5, "NVRM: Xid (PCI:0000:86:00): 13, pid=3, name=c, Graphics Exception"))
	agent = startCompanion(t, l.Context(), checkpoint, socket)
	defer agent.stop()
	waitFor(t, "the cursor at 5", cursorAt(checkpoint, 5))
	if got, x79 := xids(agent.rt, "GPU-bbbb")[13], xids(agent.rt, "GPU-aaaa")[79]; got != 1 || x79 != 0 {
		t.Errorf("after the agent's restart: XID 13 counted %d times, XID 79 %d; want 1 (logged while down) and 0", got, x79)
	}
	if healthOf(agent.rt, "GPU-aaaa") != health.Unhealthy {
		t.Error("GPU-aaaa lost its XID 79 across the restart")
	}
	if s := agent.k.Stats(); s.AlreadyApplied != 3 {
		t.Errorf("stats %+v, want the 3 XIDs applied before skipped", s)
	}
	if lines := l.Containing("Stopped reading the kernel log", "hung up"); len(lines) == 0 {
		t.Errorf("the relay's restart was not logged: %q", strings.Join(l.Lines(), "\n"))
	}
}
