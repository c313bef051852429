package remediation

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// lockedEnv makes fakeEnv's holders and slots safe to share with the controller's goroutine.
type lockedEnv struct {
	mu  sync.Mutex
	env *fakeEnv
}

func (l *lockedEnv) Holders(ctx context.Context, dev health.Device, migs []health.Device) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.env.Holders(ctx, dev, migs)
}

func (l *lockedEnv) TakeSlot(ctx context.Context, uuid string) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.env.TakeSlot(ctx, uuid)
}

func (l *lockedEnv) ReleaseSlot(ctx context.Context, uuid string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.env.ReleaseSlot(ctx, uuid)
}

// simResetter resets like the simulator: the backend reports the reset before Reset returns.
type simResetter struct {
	clock *testingclock.FakeClock
	ctrl  func() *Controller
	calls chan string
}

func (r *simResetter) Reset(_ context.Context, uuid string) error {
	r.ctrl().ResetObserved(uuid, r.clock.Now())
	r.calls <- uuid
	return nil
}

var _ gpuapi.Resetter = (*simResetter)(nil)

type observer struct {
	mu     sync.Mutex
	events []string
}

func (o *observer) Event(kind string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, kind)
}
func (o *observer) Phases(map[string]int) {}

func TestControllerRepairsSavesAndResumes(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	statePath := filepath.Join(t.TempDir(), StateFileName)
	env := &lockedEnv{env: newEnv()}
	recorder := record.NewFakeRecorder(100)
	var ctrl *Controller
	resetter := &simResetter{clock: clk, ctrl: func() *Controller { return ctrl }, calls: make(chan string, 10)}
	changed := make(chan struct{}, 100)
	obs := &observer{}
	opts := Options{
		NodeName: "n1", Config: Config{MaxAttempts: 3, Probation: time.Minute, Window: time.Hour, ResetTimeout: 30 * time.Second},
		Poll: time.Second, Clock: clk, Holders: env, Slots: env, Resetter: resetter, StatePath: statePath, BootID: "boot-1",
		Recorder: recorder, NodeRef: &corev1.ObjectReference{Kind: "Node", Name: "n1"}, Observer: obs,
		Changed: func() { changed <- struct{}{} },
	}
	var err error
	if ctrl, err = New(t.Context(), opts); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()

	ctrl.Update(health.Snapshot{Time: t0, Devices: []health.DeviceStatus{status(gpu(0), xid48)}})
	if got := <-resetter.calls; got != gpu(0).UUID {
		t.Fatalf("reset %s", got)
	}
	healthtest.Eventually(t, "probation", func() bool { return ctrl.States()[gpu(0).UUID].Phase == PhaseProbation })
	ctrl.Update(health.Snapshot{Time: t0.Add(time.Second), Devices: []health.DeviceStatus{status(gpu(0))}})
	if d := ctrl.Decorate(health.Snapshot{Devices: []health.DeviceStatus{status(gpu(0))}}).Devices[0]; d.Health != health.Unhealthy {
		t.Fatalf("GPU on probation reported %v", d.Health)
	}
	healthtest.Eventually(t, "the state file", func() bool {
		states, _ := LoadState(statePath, "boot-1")
		return states[gpu(0).UUID].Phase == PhaseProbation
	})
	if len(changed) == 0 {
		t.Error("Changed was not called")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A restart on the same boot resumes probation; the slot is still held.
	ctrl2, err := New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if p := ctrl2.States()[gpu(0).UUID].Phase; p != PhaseProbation {
		t.Fatalf("restored phase %q", p)
	}
	ctrl = ctrl2
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	go func() { done <- ctrl2.Run(ctx) }()
	ctrl2.Update(health.Snapshot{Time: t0.Add(2 * time.Second), Devices: []health.DeviceStatus{status(gpu(0))}})
	healthtest.Eventually(t, "the ticker", clk.HasWaiters)
	clk.Step(time.Minute)
	healthtest.Eventually(t, "repaired", func() bool {
		_, ok := ctrl2.States()[gpu(0).UUID]
		return ok && ctrl2.States()[gpu(0).UUID].Phase == PhaseIdle
	})
	env.mu.Lock()
	slots := len(env.env.slots)
	env.mu.Unlock()
	if slots != 0 {
		t.Error("slot kept after the repair")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(recorder.Events)
	var reasons []string
	for e := range recorder.Events {
		reasons = append(reasons, e)
	}
	all := strings.Join(reasons, "\n")
	for _, want := range []string{"Normal GPURemediationStarted GPU 0 (GPU-a)", "GPURemediationResetStarted", "GPURemediationResetObserved", "Normal GPURemediationRepaired"} {
		if !strings.Contains(all, want) {
			t.Errorf("events lack %q:\n%s", want, all)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if strings.Join(obs.events, ",") != "Started,ResetStarted,ResetObserved,Repaired" {
		t.Errorf("observed %v", obs.events)
	}
}

func TestStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", StateFileName)
	states := map[string]State{"GPU-a": {Phase: PhaseFailed, Since: t0, Attempts: []time.Time{t0}, Message: "gave up"}}
	if err := SaveState(path, "boot-1", states); err != nil {
		t.Fatal(err)
	}
	got, err := LoadState(path, "boot-1")
	if err != nil || got["GPU-a"].Phase != PhaseFailed || !got["GPU-a"].Attempts[0].Equal(t0) {
		t.Fatalf("loaded %+v, %v", got, err)
	}
	if got, err := LoadState(path, "boot-2"); err != nil || got != nil {
		t.Fatalf("another boot's states: %+v, %v", got, err)
	}
	if got, err := LoadState(filepath.Join(dir, "none.json"), "boot-1"); err != nil || got != nil {
		t.Fatalf("missing file: %+v, %v", got, err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadState(path, "boot-1"); err == nil {
		t.Fatal("a corrupt file loaded")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

func TestAnnotationValue(t *testing.T) {
	if v, err := AnnotationValue(nil, 3); v != "" || err != nil {
		t.Fatalf("%q %v", v, err)
	}
	v, err := AnnotationValue(map[string]State{"GPU-a": {Phase: PhaseWaitingForPods, Since: t0, Attempts: []time.Time{t0}, Fault: "XID48", Message: "held by ml/x"}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"GPU-a":{"phase":"WaitingForPods","since":"2026-12-01T10:00:00Z","attempts":1,"maxAttempts":3,"fault":"XID48","message":"held by ml/x"}}`
	if v != want {
		t.Errorf("value\n%s\nwant\n%s", v, want)
	}
}

// refusingResetter fails as nvidia-smi does while another process holds the GPU.
type refusingResetter struct{ calls chan string }

func (r refusingResetter) Reset(_ context.Context, uuid string) error {
	r.calls <- uuid
	return errors.New("nvidia-smi --gpu-reset: exit status 255: the GPU is in use by another client")
}

// A failed reset names the processes that have the GPU's device file open.
func TestControllerNamesTheProcessesHoldingAFailedReset(t *testing.T) {
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "4321", "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "4321", "comm"), []byte("nv-hostengine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dev := gpu(0)
	dev.Minor = 3
	if err := os.Symlink("/dev/nvidia3", filepath.Join(proc, "4321", "fd", "5")); err != nil {
		t.Fatal(err)
	}
	clk := testingclock.NewFakeClock(t0)
	env := &lockedEnv{env: newEnv()}
	recorder := record.NewFakeRecorder(100)
	resetter := refusingResetter{calls: make(chan string, 1)}
	ctrl, err := New(t.Context(), Options{
		NodeName: "n1", Config: Config{MaxAttempts: 3, Probation: time.Minute, Window: time.Hour, ResetTimeout: 30 * time.Second},
		Poll: time.Second, Clock: clk, Holders: env, Slots: env, Resetter: resetter, Recorder: recorder,
		NodeRef: &corev1.ObjectReference{Kind: "Node", Name: "n1"}, ProcRoot: proc,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = ctrl.Run(ctx) }()
	ctrl.Update(health.Snapshot{Time: t0, Devices: []health.DeviceStatus{status(dev, xid48)}})
	<-resetter.calls
	healthtest.Eventually(t, "the failed attempt", func() bool { return ctrl.States()[dev.UUID].Phase == PhaseWaitingForPods })
	if msg := ctrl.States()[dev.UUID].Message; !strings.Contains(msg, "in use by another client") ||
		!strings.Contains(msg, "processes holding the GPU's device file: 4321 (nv-hostengine)") {
		t.Errorf("the failed attempt says %q, want the tool's refusal and the process holding /dev/nvidia3", msg)
	}
}
