package breaker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
)

const rack = "topology.kubernetes.io/rack"

func TestNodeDomainsBudgetArithmetic(t *testing.T) {
	rackQuarter := []Domain{{Label: rack, MaxFraction: 0.25}}
	cases := []struct {
		name    string
		domains []Domain
		labels  map[string]string
		counted DomainGPUs
		want    []DomainBudget
	}{
		{"a domain of one node with 4 GPUs: a quarter is 1", rackQuarter, map[string]string{rack: "r1"},
			DomainGPUs{rack: {"r1": 4}}, []DomainBudget{{Label: rack, Value: "r1", GPUs: 4, Budget: 1}}},
		{"a domain of one node with 1 GPU: never below 1", rackQuarter, map[string]string{rack: "r1"},
			DomainGPUs{rack: {"r1": 1}}, []DomainBudget{{Label: rack, Value: "r1", GPUs: 1, Budget: 1}}},
		{"every node in one domain: its budget is the cluster's at the same fraction", rackQuarter, map[string]string{rack: "all"},
			DomainGPUs{rack: {"all": 1000}}, []DomainBudget{{Label: rack, Value: "all", GPUs: 1000, Budget: 250}}},
		{"a label on no node: counted nowhere, no domain", rackQuarter, map[string]string{"pool": "p"},
			DomainGPUs{}, nil},
		{"a node without the label: the cluster's budget only", rackQuarter, map[string]string{"pool": "p"},
			DomainGPUs{rack: {"r1": 8}}, nil},
		{"a value not counted (past the cap, or no GPUs): the cluster's budget only", rackQuarter, map[string]string{rack: "r9"},
			DomainGPUs{rack: {"r1": 8}}, nil},
		{"no count at all", rackQuarter, map[string]string{rack: "r1"}, nil, nil},
		{"an empty value is a value", rackQuarter, map[string]string{rack: ""},
			DomainGPUs{rack: {"": 8}}, []DomainBudget{{Label: rack, Value: "", GPUs: 8, Budget: 2}}},
		{"two labels, in the configuration's order; fractions floor", []Domain{{Label: rack, MaxFraction: 0.3}, {Label: "pool", MaxFraction: 1}},
			map[string]string{rack: "r1", "pool": "p"}, DomainGPUs{rack: {"r1": 7}, "pool": {"p": 3}},
			[]DomainBudget{{Label: rack, Value: "r1", GPUs: 7, Budget: 2}, {Label: "pool", Value: "p", GPUs: 3, Budget: 3}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := NodeDomains(tc.domains, tc.labels, tc.counted)
			if !slices.Equal(got, tc.want) {
				t.Errorf("NodeDomains = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDomainCountIsCappedInOrder(t *testing.T) {
	var c domainCount
	c.add([]string{rack, "pool"}, map[string]string{rack: "b", "pool": "p"}, 4)
	c.add([]string{rack, "pool"}, map[string]string{rack: "a"}, 2)
	c.add([]string{rack, "pool"}, map[string]string{rack: "a"}, 3)
	c.add([]string{rack, "pool"}, map[string]string{rack: "c"}, 0) // no GPUs: not a value
	c.add([]string{rack, "pool"}, map[string]string{"other": "x"}, 8)
	all, dropped := c.capped([]string{rack, "pool"}, 10)
	want := DomainGPUs{rack: {"a": 5, "b": 4}, "pool": {"p": 4}}
	if dropped != 0 || fmt.Sprint(all) != fmt.Sprint(want) {
		t.Fatalf("capped(10) = %v, %d; want %v, 0", all, dropped, want)
	}
	// Labels sort before values: pool's p goes, then rack's b.
	some, dropped := c.capped([]string{rack, "pool"}, 1)
	if want := (DomainGPUs{rack: {}, "pool": {"p": 4}}); dropped != 2 || fmt.Sprint(some) != fmt.Sprint(want) {
		t.Fatalf("capped(1) = %v, %d; want %v, 2", some, dropped, want)
	}
	data := encodeDomains(some, []Domain{{Label: rack, MaxFraction: 0.25}}, dropped)
	cm := &corev1.ConfigMap{Data: data}
	if got := ParseDomainGPUs(cm); fmt.Sprint(got) != fmt.Sprint(some) {
		t.Errorf("ParseDomainGPUs(encodeDomains) = %v, want %v", got, some)
	}
	if got := ParseDomainFractions(cm); got[rack] != 0.25 {
		t.Errorf("ParseDomainFractions = %v", got)
	}
	if data[DomainValuesDroppedKey] != "2" {
		t.Errorf("dropped key %q, want 2", data[DomainValuesDroppedKey])
	}
}

func TestParseDomainGPUsTrustsNoNonsense(t *testing.T) {
	for _, body := range []string{"", "not json", `["a"]`} {
		if got := ParseDomainGPUs(&corev1.ConfigMap{Data: map[string]string{DomainGPUsKey: body}}); len(got) != 0 {
			t.Errorf("ParseDomainGPUs(%q) = %v, want none", body, got)
		}
	}
	got := ParseDomainGPUs(&corev1.ConfigMap{Data: map[string]string{DomainGPUsKey: `{"r":{"a":-3,"b":0,"c":2}}`}})
	if fmt.Sprint(got) != fmt.Sprint(DomainGPUs{"r": {"c": 2}}) {
		t.Errorf("non-positive counts kept: %v", got)
	}
}

func TestSetDomainData(t *testing.T) {
	data := map[string]string{ClusterGPUsKey: "8"}
	want := map[string]string{DomainGPUsKey: "{}", DomainFractionsKey: "{}"}
	if !setDomainData(data, want) || data[DomainGPUsKey] != "{}" {
		t.Fatalf("first write: %v", data)
	}
	if setDomainData(data, want) {
		t.Error("the same data again changed something")
	}
	if !setDomainData(data, nil) || len(data) != 1 || data[ClusterGPUsKey] != "8" {
		t.Errorf("removing the domains left %v", data)
	}
}

func TestDomainKeysAreSlotNames(t *testing.T) {
	long := strings.Repeat("a", 63)
	k := DomainKey("example.com/"+strings.Repeat("x", 63), long)
	name := DomainSlots(nil, ns, "l", "v").Prefix + "4095"
	if len(k) != 12 || DomainKey(rack, "a") == DomainKey(rack, "b") || DomainKey("a", "b=c") == DomainKey("a=b", "c") {
		t.Errorf("keys: %q", k)
	}
	if !strings.HasPrefix(name, SlotPrefix) || len(name) > 63 {
		t.Errorf("slot name %q must keep the slots' prefix (the admission policy checks it) and be short", name)
	}
}

// domainConfigMap has a cluster count and the rack's counts.
func domainConfigMap(cluster int, racks map[string]int) *corev1.ConfigMap {
	cm := countConfigMap(cluster)
	b, _ := json.Marshal(DomainGPUs{rack: racks})
	cm.Data[DomainGPUsKey] = string(b)
	return cm
}

// startedIn returns a started Breaker for node with the rack domain at domainFraction, the node
// labelled rack=value (no label when value is empty).
func startedIn(t *testing.T, client *fake.Clientset, node, value string, fraction, domainFraction float64, clk *clocktesting.FakeClock) *Breaker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	labels := map[string]string{}
	if value != "" {
		labels[rack] = value
	}
	b := New(adapt.Clientset(client), node, Options{Namespace: ns, MaxFraction: fraction, Window: 10 * time.Minute, Clock: clk,
		Domains:    []Domain{{Label: rack, MaxFraction: domainFraction}},
		NodeLabels: func(context.Context) (map[string]string, error) { return labels, nil }})
	if err := b.Start(ctx, func() {}); err != nil {
		t.Fatal(err)
	}
	return b
}

// admitAll asks for every GPU and records the held ones, as the device-taint reporter does.
func admitAll(t *testing.T, b *Breaker, uuids ...string) (admitted int) {
	t.Helper()
	var held []string
	for _, u := range uuids {
		if admit(t, b, u) {
			admitted++
		} else {
			held = append(held, u)
		}
	}
	b.SetHeld(held)
	return admitted
}

func domainSlots(t *testing.T, client *fake.Clientset, value string) int {
	t.Helper()
	slots, err := DomainSlots(adapt.Clientset(client), ns, rack, value).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(slots)
}

func gpuNames(node string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("GPU-%s-%d", node, i))
	}
	return out
}

// TestABadRackIsHeldAtItsBudgetAndTheRestAdmitted: 32 GPUs, a cluster budget of half (16), racks
// of 8 GPUs with a quarter each (2). Rack a loses all 8; rack b 2; an unlabelled node 3: rack a
// is held at 2, everything else is admitted, and rack a's nodes name their domain.
func TestABadRackIsHeldAtItsBudgetAndTheRestAdmitted(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	client := serverTime(fake.NewClientset(domainConfigMap(32, map[string]int{"a": 8, "b": 8})), clk)
	a1 := startedIn(t, client, "a1", "a", 0.5, 0.25, clk)
	a2 := startedIn(t, client, "a2", "a", 0.5, 0.25, clk)
	b1 := startedIn(t, client, "b1", "b", 0.5, 0.25, clk)
	n := startedIn(t, client, "n", "", 0.5, 0.25, clk)
	if got := admitAll(t, a1, gpuNames("a1", 4)...) + admitAll(t, a2, gpuNames("a2", 4)...); got != 2 {
		t.Errorf("rack a: %d admitted, want its budget of 2", got)
	}
	if got := admitAll(t, b1, gpuNames("b1", 2)...); got != 2 {
		t.Errorf("rack b: %d admitted, want 2", got)
	}
	if got := admitAll(t, n, gpuNames("n", 3)...); got != 3 {
		t.Errorf("unlabelled node: %d admitted, want 3", got)
	}
	if got := domainSlots(t, client, "a"); got != 2 {
		t.Errorf("rack a holds %d domain slots, want 2 (refused GPUs hold none)", got)
	}
	if slots, _ := ListSlots(context.Background(), adapt.Clientset(client), ns); len(slots) != 7 {
		t.Errorf("%d cluster slots, want 7 (the domain slots are not among them)", len(slots))
	}
	for _, b := range []*Breaker{a1, a2} {
		if len(b.Held()) > 0 && !slices.Equal(b.HeldDomains(), []string{rack + "=a"}) {
			t.Errorf("%s holds %v, by %v; want rack=a named", b.nodeName, b.Held(), b.HeldDomains())
		}
	}
	if len(a1.Held())+len(a2.Held()) != 6 || len(b1.HeldDomains()) != 0 || len(n.HeldDomains()) != 0 {
		t.Errorf("held: a1 %v a2 %v b1 %v n %v", a1.Held(), a2.Held(), b1.HeldDomains(), n.HeldDomains())
	}
	// A GPU holding both slots stays admitted.
	slots, err := DomainSlots(adapt.Clientset(client), ns, rack, "a").List(context.Background())
	if err != nil || len(slots) == 0 {
		t.Fatalf("domain slots %v, %v", slots, err)
	}
	if by := map[string]*Breaker{"a1": a1, "a2": a2}[slots[0].Node]; by == nil || !admit(t, by, slots[0].UUID) {
		t.Errorf("the GPU holding slot %+v is no longer admitted", slots[0])
	}
}

// TestAClusterRefusalReleasesTheDomainSlot: the rack admits, the cluster refuses, and the
// rack's slot taken for the GPU is given back, so a GPU the breaker holds holds no budget.
func TestAClusterRefusalReleasesTheDomainSlot(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	// Every node in one rack: 4 GPUs, cluster budget 1, rack budget 4.
	client := serverTime(fake.NewClientset(domainConfigMap(4, map[string]int{"a": 4})), clk)
	b := startedIn(t, client, "a1", "a", 0.25, 1, clk)
	if got := admitAll(t, b, gpuNames("a1", 3)...); got != 1 {
		t.Fatalf("%d admitted, want the cluster's budget of 1", got)
	}
	if got := domainSlots(t, client, "a"); got != 1 {
		t.Errorf("rack a holds %d slots, want 1: the slots of the GPUs the cluster refused leak", got)
	}
	if d := b.HeldDomains(); len(d) != 0 {
		t.Errorf("held by the cluster's budget, but the condition would name %v", d)
	}
}

// TestAcknowledgementAndWindowFreeTheDomains: an acknowledgement ends every domain's slots too,
// which the DomainWatcher then sweeps; so does the window.
func TestAcknowledgementAndWindowFreeTheDomains(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	client := serverTime(fake.NewClientset(domainConfigMap(16, map[string]int{"a": 4})), clk)
	b := startedIn(t, client, "a1", "a", 1, 0.25, clk)
	if got := admitAll(t, b, "GPU-0", "GPU-1"); got != 1 {
		t.Fatalf("%d admitted, want rack a's budget of 1", got)
	}
	w := &DomainWatcher{Client: adapt.Clientset(client), Namespace: ns, Window: 10 * time.Minute}
	clk.Step(time.Minute)
	if err := w.Round(context.Background(), clk.Now()); err != nil {
		t.Fatal(err)
	}
	if domainSlots(t, client, "a") != 1 {
		t.Fatal("a live domain slot was swept")
	}
	clk.Step(time.Second)
	if _, err := Acknowledge(context.Background(), adapt.Clientset(client), ns, clk.Now()); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	waitAcknowledged(t, b)
	if admit(t, b, "GPU-1") {
		t.Error("admitted before the acknowledged slot was swept")
	}
	if err := w.Round(context.Background(), clk.Now()); err != nil {
		t.Fatal(err)
	}
	if !admit(t, b, "GPU-1") {
		t.Error("not admitted after the acknowledgement and a sweep")
	}
	clk.Step(11 * time.Minute)
	if err := w.Round(context.Background(), clk.Now()); err != nil {
		t.Fatal(err)
	}
	if got := domainSlots(t, client, "a"); got != 0 {
		t.Errorf("%d domain slots after the window and a sweep, want 0", got)
	}
}

// waitAcknowledged waits for the breaker's informer to see an acknowledgement.
func waitAcknowledged(t *testing.T, b *Breaker) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ack, _ := b.state(); !ack.IsZero() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the breaker never saw the acknowledgement")
		}
	}
}

type event struct{ kind, reason, message string }

type recorder struct {
	mu     sync.Mutex
	events []event
	// elsewhere are the objects of events not on the breaker's ConfigMap.
	elsewhere []string
}

func (r *recorder) Eventf(obj runtime.Object, kind, reason, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cm, ok := obj.(*corev1.ConfigMap); !ok || cm.Name != ConfigMapName {
		r.elsewhere = append(r.elsewhere, fmt.Sprintf("%T", obj))
	}
	r.events = append(r.events, event{kind, reason, fmt.Sprintf(format, args...)})
}

// TestAFullDomainIsOneFinding: however many GPUs a full rack holds, and however many rounds
// see it full, it is one Event on the breaker's ConfigMap and one metric series; a rack with
// room is none.
func TestAFullDomainIsOneFinding(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	cm := domainConfigMap(32, map[string]int{"a": 8, "b": 8})
	cm.UID = "cm-uid"
	client := serverTime(fake.NewClientset(cm), clk)
	a1 := startedIn(t, client, "a1", "a", 1, 0.25, clk)
	b1 := startedIn(t, client, "b1", "b", 1, 0.25, clk)
	admitAll(t, a1, gpuNames("a1", 8)...)
	admitAll(t, b1, gpuNames("b1", 1)...)
	rec := &recorder{}
	full := map[string]bool{}
	w := &DomainWatcher{Client: adapt.Clientset(client), Namespace: ns, Window: 10 * time.Minute, Domains: []Domain{{Label: rack, MaxFraction: 0.25}},
		Recorder: rec, Full: func(l, v string, f bool) { full[l+"="+v] = f }}
	for range 3 {
		if err := w.Round(context.Background(), clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if len(rec.events) != 1 || rec.events[0].reason != EventDomainFull || rec.events[0].kind != corev1.EventTypeWarning ||
		!strings.Contains(rec.events[0].message, rack+"=a") {
		t.Fatalf("events %+v, want one %s naming rack=a", rec.events, EventDomainFull)
	}
	if len(rec.elsewhere) > 0 {
		t.Errorf("events on %v, want them on the breaker's ConfigMap", rec.elsewhere)
	}
	if len(full) != 1 || !full[rack+"=a"] {
		t.Errorf("metric calls %v, want rack=a full only", full)
	}
	clk.Step(11 * time.Minute)
	if err := w.Round(context.Background(), clk.Now()); err != nil {
		t.Fatal(err)
	}
	if len(rec.events) != 2 || rec.events[1].reason != EventDomainClosed || full[rack+"=a"] {
		t.Errorf("after the window: events %+v, metric %v; want %s and the series gone", rec.events, full, EventDomainClosed)
	}
}

// TestCounterCountsTheDomains: each rack's GPUs go into the ConfigMap; nodes without the label
// count for the cluster only, and a value without GPUs is no value.
func TestCounterCountsTheDomains(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	labelled := func(name, value string, n int) *corev1.Node {
		nd := node(name, gpus(name, n), nil)
		nd.Labels = map[string]string{rack: value, "unrelated": "x"}
		return nd
	}
	client := fake.NewClientset(labelled("a1", "a", 4), labelled("a2", "a", 4), labelled("b1", "b", 2), node("n", gpus("n", 8), nil),
		labelled("empty", "c", 0))
	done := make(chan error, 1)
	go func() {
		done <- (&Counter{Client: adapt.Clientset(client), Namespace: ns, Domains: []Domain{{Label: rack, MaxFraction: 0.25}}}).Run(ctx)
	}()
	var cm *corev1.ConfigMap
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		cm, err = client.CoreV1().ConfigMaps(ns).Get(ctx, ConfigMapName, metav1.GetOptions{})
		if err == nil && cm.Data[ClusterGPUsKey] == "18" && cm.Data[DomainGPUsKey] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never counted: %v, %v", cm, err)
		}
	}
	if got, want := ParseDomainGPUs(cm), (DomainGPUs{rack: {"a": 8, "b": 2}}); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("domain counts %v, want %v", got, want)
	}
	if f := ParseDomainFractions(cm); f[rack] != 0.25 {
		t.Errorf("fractions %v", f)
	}
	if _, ok := cm.Data[DomainValuesDroppedKey]; ok {
		t.Errorf("nothing was dropped, but %s is set", DomainValuesDroppedKey)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
