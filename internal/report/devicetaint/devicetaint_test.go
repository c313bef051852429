package devicetaint_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func slice(node string, uuids ...string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpus"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: config.DefaultDriverName, NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
		},
	}
	for i, u := range uuids {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name:       "gpu-" + string(rune('0'+i)),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To(u)}},
		})
	}
	return s
}

func status(uuid string, index int, h health.Severity, evict bool, conds ...health.Condition) health.DeviceStatus {
	return health.DeviceStatus{Device: health.Device{UUID: uuid, Index: index}, Health: h, Evict: evict, Conditions: conds}
}

var (
	xid79   = health.Condition{Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, Reason: "XID79", Evict: true}
	thermal = health.Condition{Type: health.ConditionThermal, Severity: health.Degraded, Reason: "TemperatureAtSlowdown"}
)

func TestEffectAndTaint(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dev       health.DeviceStatus
		noExecute bool
		effect    resourceapi.DeviceTaintEffect
		key, val  string
	}{
		{"degraded is None", status("GPU-a", 0, health.Degraded, false, thermal), false, resourceapi.DeviceTaintEffectNone, "gpuhealth.dev/thermal", "TemperatureAtSlowdown"},
		{"unhealthy is NoSchedule", status("GPU-a", 0, health.Unhealthy, true, xid79), false, resourceapi.DeviceTaintEffectNoSchedule, "gpuhealth.dev/xid", "79"},
		{"evict is NoExecute when enabled", status("GPU-a", 0, health.Unhealthy, true, xid79, thermal), true, resourceapi.DeviceTaintEffectNoExecute, "gpuhealth.dev/xid", "79"},
		{"lost GPU", status("GPU-a", 0, health.Unhealthy, false, health.Condition{Type: health.ConditionGPULost, Severity: health.Unhealthy, Reason: "GPULost"}), true, resourceapi.DeviceTaintEffectNoSchedule, "gpuhealth.dev/gpu-lost", "GPULost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dra.TaintEffect(tc.dev, tc.noExecute); got != tc.effect {
				t.Errorf("Effect = %s, want %s", got, tc.effect)
			}
			key, val := dra.TaintKeyValue(tc.dev)
			if key != tc.key || val != tc.val {
				t.Errorf("Taint = %s=%s, want %s=%s", key, val, tc.key, tc.val)
			}
		})
	}
}

func TestSyncCreatesUpdatesAndDeletesRules(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-n1"}}
	client := fake.NewClientset(node, slice("n1", "GPU-a", "GPU-b"))
	var unmatched []string
	s := devicetaint.New(adapt.Clientset(client), "n1", devicetaint.Options{NoExecute: true, Unmatched: func(d health.DeviceStatus) {
		unmatched = append(unmatched, d.Device.UUID)
	}})
	rules := func() map[string]resourceapi.DeviceTaintRule {
		t.Helper()
		list, err := client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]resourceapi.DeviceTaintRule{}
		for _, r := range list.Items {
			out[r.Name] = r
		}
		return out
	}
	start(t, s)
	// sync syncs devs, checks that the API server then holds wantRules rules and that a second
	// Sync has nothing left to write (the syncer writes from its own view, so one Sync converges),
	// and returns the writes of the first.
	sync := func(wantRules int, devs ...health.DeviceStatus) int {
		t.Helper()
		n, err := s.Sync(ctx, health.Snapshot{Devices: devs})
		if err != nil {
			t.Fatal(err)
		}
		if again, err := s.Sync(ctx, health.Snapshot{Devices: devs}); err != nil || again != 0 {
			t.Fatalf("a second Sync of the same state = %d writes, %v; want 0 writes", again, err)
		}
		if got := rules(); len(got) != wantRules {
			t.Fatalf("%d rules, want %d: %v", len(got), wantRules, got)
		}
		return n
	}

	if n := sync(1, status("GPU-a", 0, health.Degraded, false, thermal), status("GPU-b", 1, health.Healthy, false)); n != 1 {
		t.Fatalf("first fault: %d writes, want 1", n)
	}
	r, ok := rules()[devicetaint.RuleName("n1", "GPU-a")]
	if !ok {
		t.Fatalf("no rule %s; rules: %v", devicetaint.RuleName("n1", "GPU-a"), rules())
	}
	sel := r.Spec.DeviceSelector
	if *sel.Driver != config.DefaultDriverName || *sel.Pool != "n1" || *sel.Device != "gpu-0" ||
		r.Spec.Taint.Effect != resourceapi.DeviceTaintEffectNone || r.Labels[devicetaint.NodeLabel] != "n1" ||
		r.Labels[devicetaint.UUIDLabel] != "GPU-a" || len(r.OwnerReferences) != 1 || r.OwnerReferences[0].UID != "uid-n1" {
		t.Errorf("rule = %+v", r)
	}

	if n := sync(1, status("GPU-a", 0, health.Degraded, false, thermal), status("GPU-b", 1, health.Healthy, false)); n != 0 {
		t.Errorf("unchanged state: %d writes, want 0", n)
	}
	if n := sync(1, status("GPU-a", 0, health.Unhealthy, true, xid79, thermal)); n != 1 {
		t.Errorf("escalation: %d writes, want 1 (an update)", n)
	}
	if got := rules()[devicetaint.RuleName("n1", "GPU-a")].Spec.Taint; got.Effect != resourceapi.DeviceTaintEffectNoExecute || got.Key != "gpuhealth.dev/xid" {
		t.Errorf("escalated taint = %+v, want NoExecute gpuhealth.dev/xid", got)
	}
	if n := sync(0, status("GPU-a", 0, health.Healthy, false), status("GPU-z", 7, health.Unhealthy, false, xid79)); n != 1 {
		t.Errorf("recovery: %d writes, want 1 (a delete)", n)
	}
	if len(rules()) != 0 {
		t.Errorf("rules left after recovery: %v", rules())
	}
	if len(unmatched) != 1 || unmatched[0] != "GPU-z" {
		t.Errorf("unmatched = %v, want [GPU-z] once", unmatched)
	}
	sync(0, status("GPU-z", 7, health.Unhealthy, false, xid79))
	if len(unmatched) != 1 {
		t.Errorf("the same unmatched device was reported again: %v", unmatched)
	}
}

func TestSyncRemovesStaleRulesFromAnEarlierRun(t *testing.T) {
	ctx := context.Background()
	stale := &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "gpuhealth-old", Labels: map[string]string{devicetaint.NodeLabel: "n1"}}}
	other := &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses", Labels: map[string]string{devicetaint.NodeLabel: "n2"}}}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, slice("n1", "GPU-a"), stale, other)
	s := devicetaint.New(adapt.Clientset(client), "n1", devicetaint.Options{})
	start(t, s)
	if n, err := s.Sync(ctx, health.Snapshot{Devices: []health.DeviceStatus{status("GPU-a", 0, health.Healthy, false)}}); err != nil || n != 1 {
		t.Fatalf("Sync = %d, %v; want 1 delete", n, err)
	}
	list, err := client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "someone-elses" {
		t.Errorf("rules = %v, want only the other node's rule left", list.Items)
	}
}

// start starts the syncer's caches, as the Writer does before the first Sync. The channel it
// returns receives a value (coalesced, as the Writer's queue does) whenever the syncer asks for
// a Sync: the cache of slices has changed.
func start(t *testing.T, s *devicetaint.Syncer) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	triggered := make(chan struct{}, 1)
	trigger := func() {
		select {
		case triggered <- struct{}{}:
		default:
		}
	}
	if err := s.Start(ctx, trigger); err != nil {
		t.Fatal(err)
	}
	return triggered
}

func TestSyncBeforeStartIsAnError(t *testing.T) {
	s := devicetaint.New(adapt.Clientset(fake.NewClientset()), "n1", devicetaint.Options{})
	if _, err := s.Sync(context.Background(), health.Snapshot{}); err == nil {
		t.Fatal("Sync before Start succeeded")
	}
}

func TestRuleNameIsAValidName(t *testing.T) {
	long := strings.Repeat("a", 240)
	for _, tc := range []struct{ node, uuid, want string }{
		{"n1", "GPU-76f99748-0f9a-e5e5-c69b-1e46cae6e125", "gpuhealth-n1-gpu-76f99748-0f9a-e5e5-c69b-1e46cae6e125"},
		{"n1", "MIG-A/B_C", "gpuhealth-n1-mig-a-b-c"},
		{"gpu-07.rack-3.example", "GPU-a", "gpuhealth-gpu-07.rack-3.example-gpu-a"},
		{long[:devicetaint.MaxPrefixedNode], "GPU-a", "gpuhealth-" + long[:devicetaint.MaxPrefixedNode] + "-"}, // a hash of the UUID follows
		{long, "GPU-a", "gpuhealth-"}, // hashes of the node and the UUID
	} {
		got := devicetaint.RuleName(tc.node, tc.uuid)
		if !strings.HasPrefix(got, tc.want) || (len(tc.node) < 100 && got != tc.want) {
			t.Errorf("RuleName(%q, %q) = %q, want %q", tc.node, tc.uuid, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 || len(got) > validation.DNS1123SubdomainMaxLength-6 {
			t.Errorf("RuleName(%q, %q) = %q (%d characters) is no name to create under: %v", tc.node, tc.uuid, got, len(got), errs)
		}
		if !strings.HasPrefix(got, devicetaint.RulePrefix(tc.node)) {
			t.Errorf("RuleName(%q, %q) = %q lacks the node's prefix, which the admission policy requires", tc.node, tc.uuid, got)
		}
	}
}

// TestANameHeldByAnotherNodeIsNotFoughtOver: another node's agent (or anyone) created a rule
// under this node's GPU's name; this node's agent may not change it (the admission policy
// denies), so it creates its rule under a generated name, says so once, and keeps matching the
// rule by its key: the next syncs write nothing, recovery deletes it.
func TestANameHeldByAnotherNodeIsNotFoughtOver(t *testing.T) {
	ctx := context.Background()
	name := devicetaint.RuleName("n1", "GPU-a")
	squatter := &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{devicetaint.NodeLabel: "n2"}}}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-n1"}}, slice("n1", "GPU-a"), squatter)
	generated := 0
	client.PrependReactor("create", "devicetaintrules", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*resourceapi.DeviceTaintRule)
		if r.Name == "" && r.GenerateName != "" { // the fake clientset does not generate names
			generated++
			r.Name = r.GenerateName + "x" + strconv.Itoa(generated)
		}
		return false, nil, nil
	})
	var taken []string
	s := devicetaint.New(adapt.Clientset(client), "n1", devicetaint.Options{NameTaken: func(name, holder string) { taken = append(taken, name+" by "+holder) }})
	start(t, s)
	sick := health.Snapshot{Devices: []health.DeviceStatus{status("GPU-a", 0, health.Unhealthy, false, xid79)}}
	if n, err := s.Sync(ctx, sick); err != nil || n != 1 {
		t.Fatalf("Sync = %d, %v; want the rule created under another name", n, err)
	}
	rules, err := client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: devicetaint.NodeLabel + "=n1"})
	if err != nil || len(rules.Items) != 1 {
		t.Fatalf("rules of n1: %v %v", err, rules)
	}
	r := rules.Items[0]
	if r.Name != name+"-x1" || r.Annotations[devicetaint.KeyAnnotation] != name || r.Spec.Taint.Key != "gpuhealth.dev/xid" {
		t.Errorf("rule %s %v %+v, want %s-x1 with key %s", r.Name, r.Annotations, r.Spec.Taint, name, name)
	}
	if want := []string{name + " by n2"}; !slices.Equal(taken, want) {
		t.Errorf("NameTaken calls %v, want %v", taken, want)
	}
	for range 2 { // also after a relist: the key matches the rule
		if n, err := s.Sync(ctx, sick); err != nil || n != 0 {
			t.Fatalf("Sync again = %d, %v; want nothing to write", n, err)
		}
		s2 := devicetaint.New(adapt.Clientset(client), "n1", devicetaint.Options{})
		start(t, s2)
		if n, err := s2.Sync(ctx, sick); err != nil || n != 0 {
			t.Fatalf("a new syncer's Sync = %d, %v; want nothing to write", n, err)
		}
	}
	healthy := health.Snapshot{Devices: []health.DeviceStatus{status("GPU-a", 0, health.Healthy, false)}}
	if n, err := s.Sync(ctx, healthy); err != nil || n != 1 {
		t.Fatalf("Sync healthy = %d, %v; want the rule deleted", n, err)
	}
	if _, err := client.ResourceV1().DeviceTaintRules().Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("the other node's rule was touched: %v", err)
	}
	if generated != 1 {
		t.Errorf("%d rules created under generated names, want 1", generated)
	}
}

// TestRulesChangedByHandAreRepairedAtTheNextRelist: the syncer does not watch rules (see the
// Syncer's doc); it writes from its own view, repairs a rule deleted by hand once Relist has
// passed, and lists again at once when a write finds its view wrong.
func TestRulesChangedByHandAreRepairedAtTheNextRelist(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-n1"}}, slice("n1", "GPU-a", "GPU-b"))
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	s := devicetaint.New(adapt.Clientset(client), "n1", devicetaint.Options{Relist: time.Minute, Clock: clk})
	start(t, s)
	lists := 0
	client.PrependReactor("list", "devicetaintrules", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		return false, nil, nil
	})
	sick := health.Snapshot{Devices: []health.DeviceStatus{status("GPU-a", 0, health.Unhealthy, false, xid79), status("GPU-b", 1, health.Healthy, false)}}
	sync := func(want int) {
		t.Helper()
		if n, err := s.Sync(ctx, sick); err != nil || n != want {
			t.Fatalf("Sync = %d, %v; want %d writes", n, err, want)
		}
	}
	sync(1)
	sync(0)
	if lists != 1 {
		t.Errorf("%d lists for two syncs, want 1 (the start-up reconcile)", lists)
	}
	name := devicetaint.RuleName("n1", "GPU-a")
	if err := client.ResourceV1().DeviceTaintRules().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sync(0) // the view still has the rule: nothing to do until the relist
	clk.SetTime(clk.Now().Add(time.Minute))
	sync(1)
	if _, err := client.ResourceV1().DeviceTaintRules().Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the rule deleted by hand was not recreated: %v", err)
	}
	if lists != 2 {
		t.Errorf("%d lists, want 2", lists)
	}

	// A rule deleted by hand while the GPU recovers: the delete finds it gone, no error.
	if err := client.ResourceV1().DeviceTaintRules().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	healthy := health.Snapshot{Devices: []health.DeviceStatus{status("GPU-a", 0, health.Healthy, false), status("GPU-b", 1, health.Healthy, false)}}
	if n, err := s.Sync(ctx, healthy); err != nil || n != 0 {
		t.Fatalf("Sync = %d, %v; want 0 writes and no error", n, err)
	}

	// A failed update (here: the server refuses it) makes the next Sync list again.
	if _, err := s.Sync(ctx, sick); err != nil {
		t.Fatal(err)
	}
	client.PrependReactor("update", "devicetaintrules", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(resourceapi.Resource("devicetaintrules"), name, errors.New("changed"))
	})
	evict := health.Snapshot{Devices: []health.DeviceStatus{status("GPU-a", 0, health.Unhealthy, false, health.Condition{Type: health.ConditionGPULost, Severity: health.Unhealthy, Reason: "GPULost"}), status("GPU-b", 1, health.Healthy, false)}}
	before := lists
	if _, err := s.Sync(ctx, evict); err == nil {
		t.Fatal("Sync succeeded although the update conflicted")
	}
	_, _ = s.Sync(ctx, evict)
	if lists != before+1 {
		t.Errorf("%d lists after a conflict, want %d", lists, before+1)
	}
}

// TestTaintMatchesDeviceTaintRule pins the promise that a driver's own taints and the agent's
// DeviceTaintRules say the same thing.
func TestTaintMatchesDeviceTaintRule(t *testing.T) {
	for _, d := range []health.DeviceStatus{
		draStatus(health.Unhealthy, health.Condition{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy, Reason: "XID48"}),
		draStatus(health.Unhealthy, health.Condition{Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, Reason: "XID79", Evict: true}),
		draStatus(health.Degraded, health.Condition{Type: health.ConditionECCCorrectedStorm, Severity: health.Degraded, Reason: "CorrectedStorm"}),
		draStatus(health.Unhealthy, health.Condition{Type: health.ConditionAdmin, Severity: health.Unhealthy, Reason: health.ReasonAdminDrain}),
	} {
		for _, noExec := range []bool{false, true} {
			got := dra.Taint(d, dra.TaintOptions{NoExecute: noExec})
			key, value := dra.TaintKeyValue(d)
			if got.Key != key || got.Value != value || got.Effect != dra.TaintEffect(d, noExec) {
				t.Errorf("Taint(%v, noExecute=%v) = %s=%s:%s, DeviceTaintRule has %s=%s:%s", d.Conditions, noExec,
					got.Key, got.Value, got.Effect, key, value, dra.TaintEffect(d, noExec))
			}
		}
	}
}

func draStatus(h health.Severity, c health.Condition) health.DeviceStatus {
	return health.DeviceStatus{Device: health.Device{UUID: "GPU-a"}, Health: h, Evict: c.Evict, Conditions: []health.Condition{c}}
}

// TestRulesFollowTheNodesUID: a Node deleted and registered again has a new UID; the rules
// owned by the old one would be garbage-collected, so at the next relist the syncer reads the
// Node again and gives its rules the new owner.
func TestRulesFollowTheNodesUID(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-old"}}, slice("n1", "GPU-a"))
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	s := devicetaint.New(adapt.Clientset(client), "n1", devicetaint.Options{Relist: time.Minute, Clock: clk})
	start(t, s)
	sick := health.Snapshot{Devices: []health.DeviceStatus{status("GPU-a", 0, health.Unhealthy, false, xid79)}}
	owner := func() types.UID {
		t.Helper()
		r, err := client.ResourceV1().DeviceTaintRules().Get(ctx, devicetaint.RuleName("n1", "GPU-a"), metav1.GetOptions{})
		if err != nil || len(r.OwnerReferences) != 1 {
			t.Fatalf("rule: %v %+v", err, r)
		}
		return r.OwnerReferences[0].UID
	}
	if _, err := s.Sync(ctx, sick); err != nil {
		t.Fatal(err)
	}
	if got := owner(); got != "uid-old" {
		t.Fatalf("owner %s", got)
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-new"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(time.Minute))
	if n, err := s.Sync(ctx, sick); err != nil || n != 1 {
		t.Fatalf("Sync after the Node came back = %d, %v; want the rule rewritten", n, err)
	}
	if got := owner(); got != "uid-new" {
		t.Errorf("owner %s after the Node was registered again, want uid-new", got)
	}
}
