package nodecondition_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// Conditions as the health library and remediation make them.
var (
	offBus        = health.Condition{Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, Reason: "XID79", Message: "XID 79: GPU has fallen off the bus", RecommendedAction: health.ActionRebootNode}
	dbe           = health.Condition{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy, Reason: "XID48", Message: "XID 48: double-bit ECC error", RecommendedAction: health.ActionResetGPU}
	returns       = health.Condition{Type: health.ConditionReplaceGPU, Severity: health.Unhealthy, Reason: health.ReasonFaultReturnsAfterRepair, Message: "XID 48 came back twice within 24h of a repair", RecommendedAction: health.ActionReplaceGPU}
	missing       = health.Condition{Type: health.ConditionGPUMissing, Severity: health.Unhealthy, Reason: "GPUMissing", Message: "0000:c1:00.0 is on the bus but NVML does not open it", RecommendedAction: health.ActionCheckHardware}
	gaveUp        = health.Condition{Type: "Remediation", Severity: health.Unhealthy, Reason: gpuhealthv1.ReasonRemediationFailed, Message: "gave up after 3 resets", RecommendedAction: health.ActionRebootNode}
	failedChecks  = health.Condition{Type: "Remediation", Severity: health.Unhealthy, Reason: gpuhealthv1.ReasonValidationFailed, Message: "dcgmi diag failed", RecommendedAction: health.ActionRebootNode}
	waitsForReset = health.Condition{Type: "Remediation", Severity: health.Unhealthy, Reason: gpuhealthv1.ReasonValidationFailed, Message: "waits for another reset", RecommendedAction: health.ActionResetGPU}
	imex          = health.Condition{Type: health.ConditionRecoveryAction, Severity: health.Unhealthy, Reason: "RecoveryActionRecoverIMEXDomain", RecommendedAction: health.ActionRecoverIMEXDomain}
	hot           = health.Condition{Type: health.ConditionThermal, Severity: health.Unhealthy, Reason: "TemperatureAtShutdown", RecommendedAction: health.ActionCheckCooling}
	spares        = health.Condition{Type: health.ConditionSRAMThreshold, Severity: health.Degraded, Reason: "SRAMThresholdExceeded", RecommendedAction: health.ActionReplaceSoon}
)

func TestRepairFor(t *testing.T) {
	degraded := func(c health.Condition) health.Condition { c.Severity = health.Degraded; return c }
	for _, tc := range []struct {
		name string
		c    health.Condition
		want nodecondition.Repair
	}{
		{"fallen off the bus", offBus, nodecondition.RepairReboot},
		{"reset-class fault: remediation's", dbe, nodecondition.RepairNone},
		{"fault back after repairs", returns, nodecondition.RepairReplace},
		{"GPU missing from the bus", missing, nodecondition.RepairReplace},
		{"remediation gave up", gaveUp, nodecondition.RepairReboot},
		{"validation failed for good", failedChecks, nodecondition.RepairReboot},
		{"validation failed, another reset to come", waitsForReset, nodecondition.RepairNone},
		{"IMEX domain to recover", imex, nodecondition.RepairReboot},
		{"too hot: cooling, not the node", hot, nodecondition.RepairNone},
		{"spares nearly spent: still works", spares, nodecondition.RepairNone},
		{"Degraded, recommending a reboot", degraded(offBus), nodecondition.RepairNone},
		{"Degraded, recommending a new GPU", degraded(returns), nodecondition.RepairNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nodecondition.RepairFor(tc.c); got != tc.want {
				t.Errorf("RepairFor = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestRepairDesired(t *testing.T) {
	mig := health.DeviceStatus{Device: health.Device{UUID: "MIG-a", Index: 0, MIG: &health.MIGPlacement{ParentUUID: "GPU-a"}}, Health: health.Unhealthy,
		Conditions: []health.Condition{offBus}}
	for _, tc := range []struct {
		name       string
		devs       []health.DeviceStatus
		held       []string
		repair     bool
		reason     string
		inMsg, not []string
	}{
		{name: "healthy", devs: []health.DeviceStatus{device(0, health.Healthy, "")},
			reason: gpuhealthv1.ReasonNoRepairRequired, inMsg: []string{"no GPU needs the node rebooted or replaced"}},
		{name: "reset-class fault", devs: []health.DeviceStatus{withCondition(device(0, health.Healthy, ""), dbe)},
			reason: gpuhealthv1.ReasonNoRepairRequired},
		{name: "a GPU off the bus", devs: []health.DeviceStatus{device(0, health.Healthy, ""), withCondition(device(1, health.Healthy, ""), offBus)},
			repair: true, reason: gpuhealthv1.ReasonRebootRequired, inMsg: []string{"GPU 1 (GPU-b) needs the node rebooted: XID 79: GPU has fallen off the bus"}},
		{name: "replace wins over reboot", devs: []health.DeviceStatus{withCondition(device(0, health.Healthy, ""), offBus), withCondition(device(2, health.Healthy, ""), returns)},
			repair: true, reason: gpuhealthv1.ReasonReplaceRequired,
			inMsg: []string{"GPU 0 (GPU-a) needs the node rebooted", "GPU 2 (GPU-c) needs the node replaced: XID 48 came back"}},
		{name: "remediation gave up", devs: []health.DeviceStatus{withCondition(withCondition(device(3, health.Healthy, ""), dbe), gaveUp)},
			repair: true, reason: gpuhealthv1.ReasonRebootRequired, inMsg: []string{"GPU 3 (GPU-d) needs the node rebooted: gave up after 3 resets"}, not: []string{"double-bit"}},
		{name: "a MIG instance's fault is its GPU's", devs: []health.DeviceStatus{device(0, health.Healthy, ""), mig},
			reason: gpuhealthv1.ReasonNoRepairRequired},
		{name: "every GPU that needs a repair held", devs: []health.DeviceStatus{withCondition(device(0, health.Healthy, ""), offBus), withCondition(device(1, health.Healthy, ""), missing)},
			held: []string{"GPU-a", "GPU-b"}, reason: gpuhealthv1.ReasonRepairHeldByCircuitBreaker,
			inMsg: []string{"circuit breaker", "gpuhealth breaker ack", "GPU 0 (GPU-a) needs the node rebooted", "GPU 1 (GPU-b) needs the node replaced"}},
		{name: "held GPUs asking for more do not raise the request", devs: []health.DeviceStatus{withCondition(device(0, health.Healthy, ""), offBus), withCondition(device(1, health.Healthy, ""), missing)},
			held: []string{"GPU-b"}, repair: true, reason: gpuhealthv1.ReasonRebootRequired,
			inMsg: []string{"GPU 0 (GPU-a) needs the node rebooted", "Besides, the circuit breaker holds back", "GPU 1 (GPU-b) needs the node replaced"}},
		{name: "held GPUs that need nothing change nothing", devs: []health.DeviceStatus{withCondition(device(0, health.Healthy, ""), dbe)},
			held: []string{"GPU-a"}, reason: gpuhealthv1.ReasonNoRepairRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := nodecondition.RepairDesired(health.Snapshot{Devices: tc.devs}, tc.held)
			if v.Repair != tc.repair || v.Reason != tc.reason {
				t.Errorf("RepairDesired = %+v, want repair %v with reason %s", v, tc.repair, tc.reason)
			}
			for _, s := range tc.inMsg {
				if !strings.Contains(v.Message, s) {
					t.Errorf("message %q lacks %q", v.Message, s)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(v.Message, s) {
					t.Errorf("message %q names %q, which needs nothing of the node", v.Message, s)
				}
			}
		})
	}
}

// repairNode is a fake cluster with node n1, a syncer for it, and a reader of its conditions.
type repairNode struct {
	t      *testing.T
	client *fake.Clientset
	clock  *clocktesting.FakePassiveClock
	s      *nodecondition.Syncer
}

func newRepairNode(t *testing.T, o nodecondition.Options) *repairNode {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	o.Clock = clk
	return &repairNode{t: t, client: client, clock: clk, s: nodecondition.New(adapt.Clientset(client), "n1", o)}
}

func (r *repairNode) sync(devs ...health.DeviceStatus) {
	r.t.Helper()
	if _, err := r.s.Sync(context.Background(), health.Snapshot{Devices: devs}); err != nil {
		r.t.Fatal(err)
	}
}

// conditions returns the node's conditions by type.
func (r *repairNode) conditions() map[corev1.NodeConditionType]corev1.NodeCondition {
	r.t.Helper()
	node, err := r.client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[corev1.NodeConditionType]corev1.NodeCondition{}
	for _, c := range node.Status.Conditions {
		out[c.Type] = c
	}
	return out
}

const accelerated = corev1.NodeConditionType("AcceleratedHardwareReady")

// TestSyncWritesTheRepairConditionInPlaceOfGPURebootRequired: a configured type is written with
// or without remediation, instead of GPURebootRequired, with the polarity of its name; a repair
// request starts its lastTransitionTime, which engines count their toleration from.
func TestSyncWritesTheRepairConditionInPlaceOfGPURebootRequired(t *testing.T) {
	for _, tc := range []struct {
		name            string
		cfg             config.RepairConditionConfig
		typ             corev1.NodeConditionType
		healthy, repair corev1.ConditionStatus
	}{
		{"Ready polarity", config.RepairConditionConfig{Type: "AcceleratedHardwareReady"}, accelerated, corev1.ConditionTrue, corev1.ConditionFalse},
		{"problem polarity", config.RepairConditionConfig{Type: "example.com/GPUNodeRepair"}, "example.com/GPUNodeRepair", corev1.ConditionFalse, corev1.ConditionTrue},
		{"polarity set", config.RepairConditionConfig{Type: "GPUNodeHealthy", RepairStatus: "False"}, "GPUNodeHealthy", corev1.ConditionTrue, corev1.ConditionFalse},
	} {
		for _, remediation := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, remediation %v", tc.name, remediation), func(t *testing.T) {
				n := newRepairNode(t, nodecondition.Options{Repair: tc.cfg, RebootRequired: remediation})
				n.sync(device(0, health.Healthy, ""), device(1, health.Healthy, ""))
				conds := n.conditions()
				if c := conds[tc.typ]; c.Status != tc.healthy || c.Reason != gpuhealthv1.ReasonNoRepairRequired {
					t.Errorf("healthy node: %+v, want %s %s", c, tc.healthy, gpuhealthv1.ReasonNoRepairRequired)
				}
				if c, ok := conds[nodecondition.RebootType]; ok {
					t.Errorf("remediation %v: GPURebootRequired written beside the repair condition: %+v", remediation, c)
				}
				n.clock.SetTime(time.Unix(2000, 0))
				n.sync(device(0, health.Healthy, ""), withCondition(device(1, health.Healthy, ""), offBus))
				c := n.conditions()[tc.typ]
				if c.Status != tc.repair || c.Reason != gpuhealthv1.ReasonRebootRequired || !strings.Contains(c.Message, "GPU 1 (GPU-b)") ||
					!c.LastTransitionTime.Time.Equal(time.Unix(2000, 0)) {
					t.Errorf("GPU off the bus: %+v, want %s %s naming GPU 1, since 2000", c, tc.repair, gpuhealthv1.ReasonRebootRequired)
				}
				if g := n.conditions()[nodecondition.Type]; g.Status != corev1.ConditionTrue {
					t.Errorf("GPUUnhealthy %+v beside the repair condition, want True", g)
				}
			})
		}
	}
}

// TestSyncAsksForNoRepairTheBreakerHoldsBack: in a wave the breaker holds a GPU back; the repair
// condition stays healthy (no transition, no toleration running) and says why, and asks for the
// repair once the breaker lets the GPU through.
func TestSyncAsksForNoRepairTheBreakerHoldsBack(t *testing.T) {
	cb := &heldBreaker{held: []string{"GPU-b"}}
	n := newRepairNode(t, nodecondition.Options{Repair: config.RepairConditionConfig{Type: "AcceleratedHardwareReady"}, Breaker: cb})
	sick := []health.DeviceStatus{device(0, health.Healthy, ""), withCondition(device(1, health.Healthy, ""), offBus)}
	n.sync(sick...)
	c := n.conditions()[accelerated]
	if c.Status != corev1.ConditionTrue || c.Reason != gpuhealthv1.ReasonRepairHeldByCircuitBreaker || !strings.Contains(c.Message, "GPU 1 (GPU-b) needs the node rebooted") {
		t.Errorf("held: %+v, want True %s naming GPU 1", c, gpuhealthv1.ReasonRepairHeldByCircuitBreaker)
	}
	if b := n.conditions()[nodecondition.BreakerType]; b.Status != corev1.ConditionTrue {
		t.Errorf("GPUCircuitBreakerOpen %+v, want True", b)
	}
	cb.held = nil
	n.clock.SetTime(time.Unix(3000, 0))
	n.sync(sick...)
	if c := n.conditions()[accelerated]; c.Status != corev1.ConditionFalse || c.Reason != gpuhealthv1.ReasonRebootRequired || !c.LastTransitionTime.Time.Equal(time.Unix(3000, 0)) {
		t.Errorf("let through: %+v, want False %s since 3000", c, gpuhealthv1.ReasonRebootRequired)
	}
}

// budgetBreaker is a breaker that admits the GPUs a test says, counting the questions.
type budgetBreaker struct {
	heldBreaker
	admit map[string]bool
	err   error
	asked int
}

func (b *budgetBreaker) Admit(_ context.Context, uuid string) (bool, error) {
	b.asked++
	return b.admit[uuid], b.err
}

// TestSyncAsksTheBreakerForEachRepair: the syncer asks the breaker itself before a GPU asks for
// a repair (without DRA devices nothing else would), and once per fault: an admitted GPU keeps
// asking whatever the breaker says later, so that an engine's toleration keeps running; a GPU
// it could not be asked about is held, and the error returned for a retry.
func TestSyncAsksTheBreakerForEachRepair(t *testing.T) {
	ctx := context.Background()
	cb := &budgetBreaker{admit: map[string]bool{}}
	n := newRepairNode(t, nodecondition.Options{Repair: config.RepairConditionConfig{Type: "AcceleratedHardwareReady"}, Breaker: cb})
	sick := []health.DeviceStatus{device(0, health.Healthy, ""), withCondition(device(1, health.Healthy, ""), offBus)}
	want := func(step string, status corev1.ConditionStatus, reason string, asked int) {
		t.Helper()
		if c := n.conditions()[accelerated]; c.Status != status || c.Reason != reason || cb.asked != asked {
			t.Errorf("%s: %+v after %d questions, want %s %s after %d", step, c, cb.asked, status, reason, asked)
		}
	}
	n.sync(sick...)
	want("budget spent", corev1.ConditionTrue, gpuhealthv1.ReasonRepairHeldByCircuitBreaker, 1)
	n.sync(sick...)
	want("budget still spent", corev1.ConditionTrue, gpuhealthv1.ReasonRepairHeldByCircuitBreaker, 2)
	cb.admit["GPU-b"] = true
	n.sync(sick...)
	want("admitted", corev1.ConditionFalse, gpuhealthv1.ReasonRebootRequired, 3)
	cb.admit["GPU-b"] = false
	n.sync(sick...)
	want("admitted before the next wave", corev1.ConditionFalse, gpuhealthv1.ReasonRebootRequired, 3)
	n.sync(device(0, health.Healthy, ""), device(1, health.Healthy, ""))
	want("rebooted", corev1.ConditionTrue, gpuhealthv1.ReasonNoRepairRequired, 3)
	n.sync(sick...)
	want("the next fault, in a wave", corev1.ConditionTrue, gpuhealthv1.ReasonRepairHeldByCircuitBreaker, 4)

	cb.admit["GPU-b"], cb.err = true, errors.New("the server is currently unable to handle the request")
	if _, err := n.s.Sync(ctx, health.Snapshot{Devices: sick}); err == nil || !strings.Contains(err.Error(), "GPU-b") {
		t.Errorf("Sync with the breaker failing = %v, want its error naming the GPU", err)
	}
	want("the breaker not answering", corev1.ConditionTrue, gpuhealthv1.ReasonRepairHeldByCircuitBreaker, 5)
}

// gatedBreaker is a breaker as the agent starts it.
type gatedBreaker struct {
	budgetBreaker
	onChange func()
}

func (b *gatedBreaker) Start(_ context.Context, onChange func()) error {
	b.onChange = onChange
	return nil
}
func (b *gatedBreaker) SetHeld(uuids []string) bool {
	changed := !slices.Equal(b.held, uuids)
	b.held = uuids
	return changed
}

// TestBreakerGatePassesEverythingOnAndSaysWhenTheBreakerChanges: the device-taint reporter
// starts, asks and tells the breaker through the gate; no question is taken before the breaker
// has started (it would admit everything); its start and every change of its state (an
// acknowledgement, a slot leaving the window) reach the gate's own callback, which makes the
// repair condition ask again, and the changes the reporter too.
func TestBreakerGatePassesEverythingOnAndSaysWhenTheBreakerChanges(t *testing.T) {
	ctx := context.Background()
	cb := &gatedBreaker{budgetBreaker: budgetBreaker{admit: map[string]bool{"GPU-a": true}}}
	var reporter, condition int
	gate := nodecondition.NewBreakerGate(cb, func() { condition++ })
	if ok, err := gate.Admit(ctx, "GPU-a"); ok || !errors.Is(err, nodecondition.ErrBreakerNotStarted) || cb.asked != 0 {
		t.Errorf("Admit before the breaker started = %v, %v after %d questions; want ErrBreakerNotStarted, the breaker not asked", ok, err, cb.asked)
	}
	if err := gate.Start(ctx, func() { reporter++ }); err != nil || cb.onChange == nil || condition != 1 {
		t.Fatalf("Start = %v, condition told %d times; the breaker was not started through the gate, or the start not told", err, condition)
	}
	cb.onChange()
	if reporter != 1 || condition != 2 {
		t.Errorf("a change of the breaker reached the reporter %d times and the condition %d more times, want 1 and 1", reporter, condition-1)
	}
	if ok, err := gate.Admit(ctx, "GPU-a"); !ok || err != nil || cb.asked != 1 {
		t.Errorf("Admit = %v, %v after %d questions", ok, err, cb.asked)
	}
	if !gate.SetHeld([]string{"GPU-c"}) || !slices.Equal(gate.Held(), []string{"GPU-c"}) {
		t.Errorf("SetHeld/Held not passed to the breaker: %v", gate.Held())
	}
}
