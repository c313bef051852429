package gpurecord

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func at(d time.Duration) metav1.Time { return metav1.NewTime(t0.Add(d)) }

func TestNameFor(t *testing.T) {
	for _, tc := range []struct{ serial, want string }{
		{"1652922034445", "1652922034445"},
		{"abc.def-1", "abc.def-1"},
		{"SIM0000000001", "sim0000000001-"},
		{"sim0000000001_", "sim0000000001-"},
		{"-x", "x-"},
		{"a..b", "a--b-"},
		{"_", "gpu-"},
	} {
		got := NameFor(tc.serial)
		if !strings.HasPrefix(got, tc.want) || (!strings.HasSuffix(tc.want, "-") && got != tc.want) {
			t.Errorf("NameFor(%q) = %q, want %q...", tc.serial, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("NameFor(%q) = %q is no object name: %v", tc.serial, got, errs)
		}
	}
	if NameFor("ABC") == NameFor("abc") {
		t.Error("two serials that differ in case share a record")
	}
	long := strings.Repeat("9", MaxSerialLength)
	if errs := validation.IsDNS1123Subdomain(NameFor(strings.Repeat("Z", MaxSerialLength))); len(errs) > 0 || NameFor(long) != long {
		t.Errorf("a serial of %d characters: %v", MaxSerialLength, errs)
	}
}

func TestValidateSerial(t *testing.T) {
	for _, ok := range []string{"1652922034445", "SIM0000000001", "a_b.c-d"} {
		if err := ValidateSerial(ok); err != nil {
			t.Errorf("ValidateSerial(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "x/y", "é", strings.Repeat("1", MaxSerialLength+1), "a\x00"} {
		if err := ValidateSerial(bad); err == nil {
			t.Errorf("ValidateSerial(%q) took it", bad)
		}
	}
}

func fault(d time.Duration, node string) Event {
	return Event{Time: at(d), Kind: EventFault, Reason: "XID79", Node: node, Index: 0}
}

func TestObserveCountsEachEventOnce(t *testing.T) {
	r := &GPURecord{Serial: "1"}
	o := Observation{Node: "a", Index: 0, UUID: "GPU-a", Model: "H100", Events: []Event{fault(0, "a"), {Time: at(time.Minute), Kind: EventReset, Node: "a"}}}
	if !Observe(r, o, t0.Add(time.Minute)) {
		t.Fatal("the first observation changed nothing")
	}
	if Observe(r, o, t0.Add(2*time.Minute)) {
		t.Fatal("the same report changed the record again")
	}
	if r.Counts[EventFault] != 1 || r.Counts[EventReset] != 1 || len(r.Events) != 2 || r.Model != "H100" {
		t.Fatalf("record = %+v", r)
	}
	// LastSeen moves at most every LastSeenEvery.
	if !Observe(r, o, t0.Add(time.Minute+LastSeenEvery)) {
		t.Fatal("LastSeen did not move after LastSeenEvery")
	}
	// The card moves: a second placement, its events from the new node beside the old ones.
	o2 := Observation{Node: "b", Index: 3, UUID: "GPU-b", Events: []Event{fault(2*time.Hour, "b")}}
	if !Observe(r, o2, t0.Add(2*time.Hour)) || len(r.Placements) != 2 || r.Counts[EventFault] != 2 {
		t.Fatalf("after the move: %+v", r)
	}
	if r.Events[len(r.Events)-1].Node != "b" {
		t.Fatalf("events out of order: %+v", r.Events)
	}
}

func TestObserveBoundsTheRecord(t *testing.T) {
	r := &GPURecord{Serial: "1"}
	for i := range MaxEvents + 10 {
		Observe(r, Observation{Node: "a", UUID: "GPU-a", Events: []Event{fault(time.Duration(i)*time.Minute, "a")}}, t0)
	}
	if len(r.Events) != MaxEvents || r.Counts[EventFault] != MaxEvents+10 {
		t.Fatalf("%d events, %d counted", len(r.Events), r.Counts[EventFault])
	}
	// An event older than all those kept is one the record dropped: not counted again.
	if Observe(r, Observation{Node: "a", UUID: "GPU-a", Events: []Event{fault(0, "a")}}, t0) {
		t.Fatal("a dropped event was taken again")
	}
	for i := range MaxPlacements + 3 {
		node := fmt.Sprintf("n%d", i)
		Observe(r, Observation{Node: node, UUID: "GPU-" + node}, t0.Add(time.Duration(i)*time.Hour))
	}
	if len(r.Placements) != MaxPlacements || r.Placements[0].Node != "n3" {
		t.Fatalf("%d placements, first %s", len(r.Placements), r.Placements[0].Node)
	}
}

func TestAnEscalationIsOneEventUntilCleared(t *testing.T) {
	r := &GPURecord{Serial: "1"}
	esc := func(d time.Duration) Observation {
		return Observation{Node: "a", UUID: "GPU-a", Events: []Event{{Time: at(d), Kind: EventReplaceGPU, Node: "a"}}}
	}
	Observe(r, esc(0), t0)
	Observe(r, esc(time.Minute), t0) // its worst condition's time moved
	if r.Counts[EventReplaceGPU] != 1 {
		t.Fatalf("one escalation counted %d times", r.Counts[EventReplaceGPU])
	}
	Observe(r, Observation{Node: "a", UUID: "GPU-a", Events: []Event{{Time: at(time.Hour), Kind: EventCleared, Node: "a"}}}, t0)
	Observe(r, esc(2*time.Hour), t0)
	if r.Counts[EventReplaceGPU] != 2 {
		t.Fatalf("an escalation after a clear counted %d", r.Counts[EventReplaceGPU])
	}
}

func TestRepeatOffenderRule(t *testing.T) {
	rule := RepeatOffenderRule{Faults: 3, Within: 30 * 24 * time.Hour, ReplaceGPU: true}
	now := t0.Add(40 * 24 * time.Hour)
	day := 24 * time.Hour
	for _, tc := range []struct {
		name   string
		events []Event
		want   bool
		says   []string
	}{
		{"no past", nil, false, nil},
		{"two faults", []Event{fault(20*day, "a"), fault(21*day, "a")}, false, nil},
		{"three faults on two nodes", []Event{fault(20*day, "a"), fault(21*day, "a"), fault(39*day, "b")}, true,
			[]string{"board serial S: 3 faults within 720h0m0s on nodes a, b", "XID79 on b GPU 0 at 2027-01-09T10:00:00Z"}},
		{"one of three outside the window", []Event{fault(5*day, "a"), fault(21*day, "a"), fault(39*day, "b")}, false, nil},
		{"cleared after two", []Event{fault(20*day, "a"), fault(21*day, "a"), {Time: at(22 * day), Kind: EventCleared, Node: "a"}, fault(39*day, "b")}, false, nil},
		{"a previous ReplaceGPU", []Event{{Time: at(day), Kind: EventReplaceGPU, Node: "a"}}, true, []string{"escalated to ReplaceGPU on node a"}},
		{"a ReplaceGPU cleared", []Event{{Time: at(day), Kind: EventReplaceGPU, Node: "a"}, {Time: at(2 * day), Kind: EventCleared, Node: "a"}}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := rule.Judge(&GPURecord{Serial: "S", Events: tc.events}, now)
			if v.Offender != tc.want {
				t.Fatalf("Offender = %v (%s)", v.Offender, v.Message)
			}
			for _, s := range tc.says {
				if !strings.Contains(v.Message, s) {
					t.Errorf("message %q lacks %q", v.Message, s)
				}
			}
			if v.Offender && !v.Newest.Equal(tc.events[len(tc.events)-1].Time.Time) {
				t.Errorf("Newest = %v", v.Newest)
			}
		})
	}
	one := RepeatOffenderRule{Faults: 1, Within: day}.Judge(&GPURecord{Serial: "S", Events: []Event{fault(39*day, "a")}}, now)
	if !one.Offender || !strings.Contains(one.Message, "1 fault within 24h0m0s on node a;") {
		t.Errorf("one fault: %+v", one)
	}
	if (RepeatOffenderRule{}).Enabled() {
		t.Error("the zero rule is enabled")
	}
}

// The chart installs the CRD this package embeds.
func TestTheChartInstallsThisCRD(t *testing.T) {
	chart, err := os.ReadFile("../../deployments/helm/gpuhealth/crds/gpurecords.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(chart) != string(CRD) {
		t.Fatal("deployments/helm/gpuhealth/crds/gpurecords.yaml differs from pkg/gpurecord/crd.yaml: copy one onto the other")
	}
	var crd struct {
		Spec struct {
			Group    string
			Names    struct{ Kind, Plural string }
			Versions []struct{ Name string }
		}
	}
	if err := yaml.Unmarshal(CRD, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Spec.Group != Group || crd.Spec.Names.Kind != Kind || crd.Spec.Names.Plural != Resource || crd.Spec.Versions[0].Name != Version {
		t.Fatalf("the CRD serves %+v", crd.Spec)
	}
}

// The API server keeps times to the second: a report seen again after the record went through
// it is the same report.
func TestObserveAfterARoundTripThroughTheServer(t *testing.T) {
	r := &GPURecord{Serial: "1"}
	withNanos := t0.Add(123456789)
	o := Observation{Node: "a", UUID: "GPU-a", Events: []Event{{Time: metav1.NewTime(withNanos), Kind: EventFault, Reason: "XID79", Node: "a"}}}
	Observe(r, o, withNanos)
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back GPURecord
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if Observe(&back, o, withNanos.Add(time.Second)) {
		t.Fatalf("the same report changed the record read back: %+v", back)
	}
	if back.Counts[EventFault] != 1 {
		t.Fatalf("counts %v", back.Counts)
	}
}
