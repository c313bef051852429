package remediation

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
)

const dcgmLabel = "nvidia.com/gpu.deploy.dcgm"

// componentEnv is fakeEnv with the GPU operator's components: running lists them, paused the
// labels the machine paused (restored clears it).
type componentEnv struct {
	*fakeEnv
	running  []Component
	paused   []string
	pauses   [][]string
	restores int
}

func (e *componentEnv) Components(context.Context) ([]Component, error) { return e.running, nil }
func (e *componentEnv) PauseComponents(_ context.Context, labels []string) ([]string, error) {
	e.pauses = append(e.pauses, labels)
	e.paused = labels
	return labels, nil
}

func (e *componentEnv) RestoreComponents(context.Context) ([]string, error) {
	e.restores++
	out := e.paused
	e.paused = nil
	return out, nil
}
func (e *componentEnv) PausedComponents() []string { return e.paused }

func newComponentRig(t *testing.T, pause bool) (*rig, *componentEnv) {
	r := newRig(t, Config{})
	r.m.cfg.PauseComponents = pause
	env := &componentEnv{fakeEnv: r.env, running: []Component{{Label: dcgmLabel, Pods: []string{"gpu-operator/nvidia-dcgm-x"}}}}
	r.m.env = env
	return r, env
}

// Without leave to pause them, a GPU the operator's components hold waits, saying who and what
// to set: no slot, no reset.
func TestComponentsHoldTheGPUWithoutLeaveToPause(t *testing.T) {
	r, env := newComponentRig(t, false)
	ev := r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseWaitingForPods)
	i := slices.IndexFunc(ev, func(e Event) bool { return e.Kind == KindWaiting })
	if i < 0 || !strings.Contains(ev[i].Message, "held by the GPU operator's components dcgm (gpu-operator/nvidia-dcgm-x)") ||
		!strings.Contains(ev[i].Message, "remediation.pauseOperatorComponents") {
		t.Fatalf("events %+v: want a Waiting event naming the components and the setting", ev)
	}
	if len(env.slots) != 0 || len(env.resets) != 0 || len(env.pauses) != 0 {
		t.Errorf("slots %v, resets %v, pauses %v: want none", env.slots, env.resets, env.pauses)
	}
	// Said once.
	r.clock.Step(time.Minute)
	if ev := r.step(snap(status(gpu(0), xid48))); len(ev) != 0 {
		t.Errorf("events on the next step: %v, want none", kinds(ev))
	}
}

// With leave: slot, pause, wait for the pods to go, reset, and the components restored once no
// GPU needs them paused.
func TestComponentsPausedForTheReset(t *testing.T) {
	r, env := newComponentRig(t, true)
	ev := r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhasePausingComponents)
	if !slices.Contains(kinds(ev), KindPausedComponents) || len(env.pauses) != 1 || !slices.Equal(env.pauses[0], []string{dcgmLabel}) {
		t.Fatalf("events %v, pauses %v: want the dcgm label paused once", kinds(ev), env.pauses)
	}
	if !slices.Equal(env.slots, []string{gpu(0).UUID}) || len(env.resets) != 0 {
		t.Fatalf("slots %v resets %v: want the slot held and no reset while the pods run", env.slots, env.resets)
	}
	r.clock.Step(5 * time.Second)
	r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhasePausingComponents)
	if env.restores != 0 {
		t.Fatal("components restored while the GPU waits for them to leave")
	}
	env.running = nil // the DaemonSet controller removed the pods
	r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseResetting)
	if !slices.Equal(env.resets, []string{gpu(0).UUID}) || env.restores != 0 {
		t.Fatalf("resets %v restores %d: want the reset started, the components still paused", env.resets, env.restores)
	}
	r.m.ResetFinished(gpu(0).UUID, nil)
	r.m.ResetObserved(gpu(0).UUID, r.clock.Now())
	ev = r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseProbation)
	if env.restores != 1 || !slices.Contains(kinds(ev), KindRestoredComponents) || len(env.paused) != 0 {
		t.Errorf("after the reset: restores %d, events %v: want the components restored once", env.restores, kinds(ev))
	}
	if len(r.m.States()[gpu(0).UUID].Attempts) != 1 {
		t.Errorf("attempts %v, want the reset counted once", r.m.States()[gpu(0).UUID].Attempts)
	}
}

// Components that never leave fail the attempt after the reset timeout: the slot is given back
// and the components restored.
func TestComponentsThatDoNotLeave(t *testing.T) {
	r, env := newComponentRig(t, true)
	r.step(snap(status(gpu(0), xid48)))
	r.clock.Step(31 * time.Second)
	ev := r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseWaitingForPods)
	i := slices.IndexFunc(ev, func(e Event) bool { return e.Kind == KindAttemptFailed })
	if i < 0 || !strings.Contains(ev[i].Message, "did not leave within 30s: dcgm (gpu-operator/nvidia-dcgm-x)") {
		t.Fatalf("events %+v: want a failed attempt saying the components did not leave", ev)
	}
	if len(env.slots) != 0 || env.restores != 1 || len(env.resets) != 0 {
		t.Errorf("slots %v restores %d resets %v: want the slot back, the components restored, no reset", env.slots, env.restores, env.resets)
	}
}

// A pause an earlier agent recorded and did not restore is restored at the first step when no
// repair needs it.
func TestComponentsLeftPausedByAnEarlierAgent(t *testing.T) {
	r, env := newComponentRig(t, true)
	env.paused = []string{dcgmLabel}
	env.running = nil
	ev := r.step(snap(status(gpu(0))))
	if env.restores != 1 || !slices.Contains(kinds(ev), KindRestoredComponents) {
		t.Errorf("restores %d, events %v: want the earlier pause restored", env.restores, kinds(ev))
	}
}

func nodeWith(labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: labels}}
}

type liveNode struct{ client *fake.Clientset }

func (l liveNode) Get(ctx context.Context) (*corev1.Node, error) {
	return l.client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
}

// The pauser records before it changes, restores exactly what it changed (absent stays absent,
// a label someone changed since is left), and a new pauser finds an earlier one's record.
func TestComponentPauserRecordsAndRestores(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset(nodeWith(map[string]string{dcgmLabel: "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true", "other": "x"}))
	path := filepath.Join(t.TempDir(), ComponentRecordFileName)
	p, err := NewComponentPauser(adapt.Clientset(client), "n1", path)
	if err != nil {
		t.Fatal(err)
	}
	labels := []string{dcgmLabel, "nvidia.com/gpu.deploy.dcgm-exporter", "nvidia.com/gpu.deploy.gpu-feature-discovery", "other", "nvidia.com/gpu.deploy.driver"}
	changed, err := p.Pause(ctx, labels)
	if err != nil || len(changed) != 3 {
		t.Fatalf("Pause = %v, %v; want the three GPU clients' labels (not \"other\", never the driver's)", changed, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("no record after the pause: %v", err)
	}
	n, _ := liveNode{client}.Get(ctx)
	for _, k := range labels[:3] {
		if n.Labels[k] != ComponentPausedValue {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], ComponentPausedValue)
		}
	}
	// An agent restart: a new pauser reads the record.
	p2, err := NewComponentPauser(adapt.Clientset(client), "n1", path)
	if err != nil || !slices.Equal(p2.Paused(), labels[:3]) {
		t.Fatalf("a new pauser's record = %v, %v; want the three labels", p2.Paused(), err)
	}
	// Someone decided about dcgm-exporter meanwhile: left as they set it.
	n.Labels["nvidia.com/gpu.deploy.dcgm-exporter"] = "false"
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	restored, err := p2.Restore(ctx)
	if err != nil || !slices.Equal(restored, []string{dcgmLabel, "nvidia.com/gpu.deploy.gpu-feature-discovery"}) {
		t.Fatalf("Restore = %v, %v", restored, err)
	}
	n, _ = liveNode{client}.Get(ctx)
	want := map[string]string{dcgmLabel: "true", "nvidia.com/gpu.deploy.dcgm-exporter": "false", "other": "x"}
	if len(n.Labels) != len(want) {
		t.Errorf("labels %v, want %v", n.Labels, want)
	}
	for k, v := range want {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (all: %v)", k, n.Labels[k], v, n.Labels)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the record is still there after the restore: %v", err)
	}
}

// Components are the running pods on the node whose nodeSelector names a gpu.deploy label; the
// agent's own pod and finished pods are not.
func TestComponentsRunning(t *testing.T) {
	pod := func(ns, name, node string, sel map[string]string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{NodeName: node, NodeSelector: sel}, Status: corev1.PodStatus{Phase: phase}}
	}
	client := fake.NewClientset(
		pod("gpu-operator", "nvidia-dcgm-1", "n1", map[string]string{dcgmLabel: "true"}, corev1.PodRunning),
		pod("gpu-operator", "nvidia-dcgm-2", "n2", map[string]string{dcgmLabel: "true"}, corev1.PodRunning),
		pod("gpu-operator", "gfd-1", "n1", map[string]string{"nvidia.com/gpu.deploy.gpu-feature-discovery": "true", "nvidia.com/gpu.present": "true"}, corev1.PodRunning),
		pod("gpuhealth-system", "gpuhealth-agent-1", "n1", map[string]string{"nvidia.com/gpu.deploy.client": "true"}, corev1.PodRunning),
		pod("gpu-operator", "validator-1", "n1", map[string]string{"nvidia.com/gpu.deploy.operator-validator": "true"}, corev1.PodSucceeded),
		pod("default", "job", "n1", nil, corev1.PodRunning),
		pod("gpu-operator", "nvidia-driver-daemonset-1", "n1", map[string]string{"nvidia.com/gpu.deploy.driver": "true"}, corev1.PodRunning),
		pod("gpu-operator", "nvidia-container-toolkit-1", "n1", map[string]string{"nvidia.com/gpu.deploy.container-toolkit": "true"}, corev1.PodRunning),
		pod("other", "nvsentinel", "n1", map[string]string{"nvidia.com/gpu.deploy.client": "true"}, corev1.PodRunning),
	)
	got, err := Components{Client: adapt.Clientset(client), NodeName: "n1", Self: "gpuhealth-system/gpuhealth-agent-1"}.Running(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d := DescribeComponents(got); d != "dcgm (gpu-operator/nvidia-dcgm-1), gpu-feature-discovery (gpu-operator/gfd-1)" {
		t.Errorf("Running = %s", d)
	}
}
