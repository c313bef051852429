package watch

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

const testNamespace = "gpuhealth-system"

var t0 = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

// Drivers of the test fleet: A on the even nodes, B on the odd ones.
const driverA, driverB = "580.95.05", "575.57.08"

// fault is one GPU's fault in a test fleet: on node n, GPU g.
type fault struct {
	n, g   int
	at     time.Time
	reason string
}

// testNode is node n of a fleet of 8-GPU nodes, with faults (those of other nodes ignored).
func testNode(t *testing.T, n int, faults []fault) *corev1.Node {
	t.Helper()
	driver := driverA
	if n%2 == 1 {
		driver = driverB
	}
	summaries := map[string]gpuhealthv1.GPUSummary{}
	for g := range 8 {
		s := gpuhealthv1.GPUSummary{Index: g, Model: "NVIDIA H100 80GB HBM3", Health: health.Healthy.String()}
		var history []health.HistoryEntry
		for _, f := range faults {
			if f.n == n && f.g == g {
				history = append(history, health.HistoryEntry{Time: f.at, Kind: health.HistoryFault, Reason: f.reason})
			}
		}
		if history != nil {
			s.History = gpuhealthv1.SummarizeHistory(history)
		}
		summaries[gpuUUID(n, g)] = s
	}
	b, err := json.Marshal(summaries)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        fmt.Sprintf("node-%02d", n),
		Labels:      map[string]string{fleet.DriverVersionLabel: driver, "example.com/rack": fmt.Sprintf("r%d", n/4)},
		Annotations: map[string]string{gpuhealthv1.HealthKey: string(b)},
	}}
}

func gpuUUID(n, g int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-%012d", n, g) }

// testFleet is 20 nodes of 8 GPUs with faults.
func testFleet(t *testing.T, faults ...fault) []*corev1.Node {
	t.Helper()
	var nodes []*corev1.Node
	for n := range 20 {
		nodes = append(nodes, testNode(t, n, faults))
	}
	return nodes
}

// driverAWave is two XID 79s on each of 8 of driver A's 10 nodes, within the hour before at.
func driverAWave(at time.Time) []fault {
	var out []fault
	for i := range 8 {
		for g := range 2 {
			out = append(out, fault{n: 2 * i, g: g, at: at.Add(-time.Duration(5+i+g) * time.Minute), reason: "XID79"})
		}
	}
	return out
}

// fixture is a Watcher on a fake clientset, its Events and metrics recorded.
type fixture struct {
	client   *fake.Clientset
	recorder *record.FakeRecorder
	w        *Watcher

	mu         sync.Mutex
	series     map[string]bool // attribute=value of the findings' series
	signatures int
}

func newFixture(t *testing.T, settings Settings) *fixture {
	t.Helper()
	f := &fixture{client: fake.NewClientset(), recorder: record.NewFakeRecorder(100), series: map[string]bool{}}
	w, err := New(Options{
		Settings: settings, Client: adapt.Clientset(f.client), Namespace: testNamespace, Recorder: f.recorder,
		Clock: clocktesting.NewFakeClock(t0),
		Finding: func(attribute, value string, current bool) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if current {
				f.series[attribute+"="+value] = true
			} else {
				delete(f.series, attribute+"="+value)
			}
		},
		Signatures: func(n int) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.signatures = n
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.w = w
	return f
}

// judge judges in at now, which must succeed.
func (f *fixture) judge(t *testing.T, now time.Time, in Input) {
	t.Helper()
	if err := f.w.judge(t.Context(), now, in); err != nil {
		t.Fatal(err)
	}
}

// writes counts the findings ConfigMap's creates and updates so far.
func (f *fixture) writes() int {
	n := 0
	for _, a := range f.client.Actions() {
		if a.GetResource().Resource == "configmaps" && (a.GetVerb() == "create" || a.GetVerb() == "update") {
			n++
		}
	}
	return n
}

// events returns the Events posted since the last call.
func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (f *fixture) seriesNow() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.series))
}

func (f *fixture) findings(t *testing.T) Findings {
	t.Helper()
	cm, err := f.client.CoreV1().ConfigMaps(testNamespace).Get(t.Context(), ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := ParseFindings(cm)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFindingAppearsStaysAndGoes: a finding is one Event and one series when it appears, nothing
// while it stays, and a Gone Event and no series when it ends; the ConfigMap is written only when
// the verdict changes, or RefreshEvery after the last write.
func TestFindingAppearsStaysAndGoes(t *testing.T) {
	f := newFixture(t, Settings{Labels: []string{"example.com/rack"}})
	wantDriverA := []string{fleet.AttributeDriver + "=" + driverA}
	steps := []struct {
		name   string
		at     time.Time
		faults []fault
		writes int
		events []string // the start of each Event
		series []string
	}{
		{name: "a quiet fleet: the verdict is written, nothing said", at: t0, writes: 1},
		{name: "still quiet: nothing written", at: t0.Add(time.Minute), writes: 1},
		{name: "a wave on driver A: one Event, one series", at: t0.Add(2 * time.Minute), faults: driverAWave(t0.Add(2 * time.Minute)), writes: 2,
			events: []string{"Warning " + EventSharedCause + " GPUs sharing driver=" + driverA + " fail far more often than the rest: 16 of its 80 GPUs had a fault in the last 1h0m0s, on 8 of its 10 nodes"},
			series: wantDriverA},
		{name: "the wave stays: nothing new", at: t0.Add(3 * time.Minute), faults: driverAWave(t0.Add(2 * time.Minute)), writes: 2, series: wantDriverA},
		{name: "unchanged for RefreshEvery: written again, nothing said", at: t0.Add(2*time.Minute + RefreshEvery), faults: driverAWave(t0.Add(2 * time.Minute)), writes: 3, series: wantDriverA},
		{name: "the faults are gone: the Gone Event, no series", at: t0.Add(13 * time.Minute), writes: 4,
			events: []string{"Normal " + EventSharedCauseGone + " driver=" + driverA + " is no longer a shared cause"}},
		{name: "gone it stays", at: t0.Add(14 * time.Minute), writes: 4},
	}
	for _, s := range steps {
		f.judge(t, s.at, Input{Nodes: testFleet(t, s.faults...)})
		events := f.events()
		if f.writes() != s.writes {
			t.Errorf("%s: %d writes of the ConfigMap, want %d", s.name, f.writes(), s.writes)
		}
		if len(events) != len(s.events) {
			t.Errorf("%s: events %q, want %d", s.name, events, len(s.events))
		}
		for i := range min(len(events), len(s.events)) {
			if !strings.HasPrefix(events[i], s.events[i]) {
				t.Errorf("%s: event %q, want %q...", s.name, events[i], s.events[i])
			}
		}
		if got := f.seriesNow(); !slices.Equal(got, s.series) {
			t.Errorf("%s: series %v, want %v", s.name, got, s.series)
		}
		if got := f.findings(t); len(got.SharedCauses) != len(s.series) {
			t.Errorf("%s: the ConfigMap holds %+v, want %d findings", s.name, got.SharedCauses, len(s.series))
		}
	}
}

// TestTheConfigMapSaysWhatWasJudged: the verdict in the ConfigMap, read back, is the judge's.
func TestTheConfigMapSaysWhatWasJudged(t *testing.T) {
	f := newFixture(t, Settings{})
	now := t0.Add(time.Hour)
	f.judge(t, now, Input{Nodes: testFleet(t, driverAWave(now)...), PodsErr: fmt.Errorf("forbidden")})
	got := f.findings(t)
	if !got.JudgedAt.Equal(now) || got.Window.Duration != time.Hour || !got.WorkloadsUnknown || got.GPUs != 160 || got.FaultyGPUs != 16 ||
		len(got.SharedCauses) != 1 || len(got.Signatures) != 0 {
		t.Fatalf("verdict %+v", got)
	}
	c := got.SharedCauses[0]
	if c.Attribute != fleet.AttributeDriver || c.Value != driverA || c.FaultyGPUs != 16 || c.GPUs != 80 || c.FaultyNodes != 8 ||
		len(c.Reasons) != 1 || c.Reasons[0] != (sharedcause.ReasonCount{Reason: "XID79", Faults: 16}) {
		t.Errorf("finding %+v", c)
	}
}

// TestAWorkloadSignatureIsReportedOnce: a job's burst is one Event while it stays in the window,
// even as its first faults leave it; a later burst of the same job is another.
func TestAWorkloadSignatureIsReportedOnce(t *testing.T) {
	f := newFixture(t, Settings{Judge: sharedcause.Options{Window: 10 * time.Minute}})
	var pods []fleet.WorkloadPod
	var faults []fault
	burst := func(at time.Time) {
		for i := range 6 {
			faults = append(faults, fault{n: 1 + 2*i, g: 7, at: at.Add(time.Duration(i) * time.Second), reason: "XID45"})
		}
	}
	for i := range 6 {
		pods = append(pods, fleet.WorkloadPod{Workload: "podgroup/default/job-1", Node: fmt.Sprintf("node-%02d", 1+2*i), Cards: []int{7}})
	}
	burst(t0)
	steps := []struct {
		name   string
		at     time.Time
		events int
		sigs   int
	}{
		{"the burst", t0.Add(time.Minute), 1, 1},
		{"it stays", t0.Add(2 * time.Minute), 0, 1},
		{"its first two faults left the window", t0.Add(10*time.Minute + 1500*time.Millisecond), 0, 1},
		{"it left the window", t0.Add(11 * time.Minute), 0, 0},
	}
	for _, s := range steps {
		f.judge(t, s.at, Input{Nodes: testFleet(t, faults...), Pods: pods})
		events := f.events()
		if len(events) != s.events || s.events > 0 && !strings.HasPrefix(events[0], "Warning "+EventWorkloadSignature+" workload podgroup/default/job-1: XID45 on 6 of its 6 GPUs") {
			t.Errorf("%s: events %q, want %d signature Event", s.name, events, s.events)
		}
		if f.signatures != s.sigs {
			t.Errorf("%s: signatures gauge %d, want %d", s.name, f.signatures, s.sigs)
		}
		if len(f.seriesNow()) != 0 {
			t.Errorf("%s: series %v: a job's burst is no shared cause", s.name, f.seriesNow())
		}
	}
	burst(t0.Add(20 * time.Minute))
	f.judge(t, t0.Add(21*time.Minute), Input{Nodes: testFleet(t, faults...), Pods: pods})
	if events := f.events(); len(events) != 1 {
		t.Errorf("a later burst: events %q, want one", events)
	}
}

// TestAFailedWriteKeepsTheLastVerdict: while the ConfigMap cannot be written nothing is said;
// the next judgement that writes says it once.
func TestAFailedWriteKeepsTheLastVerdict(t *testing.T) {
	f := newFixture(t, Settings{})
	f.judge(t, t0, Input{Nodes: testFleet(t)})
	var failing bool
	f.client.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failing {
			return true, nil, fmt.Errorf("the API server is away")
		}
		return false, nil, nil
	})
	failing = true
	wave := testFleet(t, driverAWave(t0)...)
	if err := f.w.judge(t.Context(), t0.Add(time.Minute), Input{Nodes: wave}); err == nil {
		t.Fatal("judge wrote through a failing API server")
	}
	if events, series := f.events(), f.seriesNow(); len(events) != 0 || len(series) != 0 {
		t.Errorf("after a failed write: events %q, series %v; want none", events, series)
	}
	failing = false
	f.judge(t, t0.Add(2*time.Minute), Input{Nodes: wave})
	if events, series := f.events(), f.seriesNow(); len(events) != 1 || len(series) != 1 {
		t.Errorf("once written: events %q, series %v; want one of each", events, series)
	}
}

// TestANewLeaderTakesOverTheVerdict: a Watcher that finds its predecessor's verdict takes it as
// its own: unchanged, it is not written again and its findings are not announced again (their
// series are set); a finding that ended since is announced gone.
func TestANewLeaderTakesOverTheVerdict(t *testing.T) {
	f := newFixture(t, Settings{})
	wave := testFleet(t, driverAWave(t0)...)
	f.judge(t, t0, Input{Nodes: wave})
	f.events()
	series := map[string]bool{}
	next, err := New(Options{Client: adapt.Clientset(f.client), Namespace: testNamespace, Recorder: f.recorder,
		Finding: func(attribute, value string, current bool) { series[attribute+"="+value] = current }})
	if err != nil {
		t.Fatal(err)
	}
	if err := next.judge(t.Context(), t0.Add(time.Minute), Input{Nodes: wave}); err != nil {
		t.Fatal(err)
	}
	if f.writes() != 1 {
		t.Errorf("%d writes, want the first alone", f.writes())
	}
	if events := f.events(); len(events) != 0 {
		t.Errorf("the new leader's events %q: want none", events)
	}
	if !series[fleet.AttributeDriver+"="+driverA] {
		t.Errorf("the new leader's series %v: want driver A's", series)
	}
	if err := next.judge(t.Context(), t0.Add(2*time.Minute), Input{Nodes: testFleet(t)}); err != nil {
		t.Fatal(err)
	}
	if events := f.events(); len(events) != 1 || !strings.HasPrefix(events[0], "Normal "+EventSharedCauseGone) || series[fleet.AttributeDriver+"="+driverA] {
		t.Errorf("after the wave: events %q, series %v; want the Gone Event and no series", events, series)
	}
}

// configSection parses a fleet.sharedCauses section (empty: none).
func configSection(t *testing.T, body string) config.SharedCausesConfig {
	t.Helper()
	src := "apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\n"
	if body != "" {
		src += "fleet:\n  sharedCauses: " + body + "\n"
	}
	c, err := config.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return c.Fleet.SharedCauses
}

func TestSettingsFrom(t *testing.T) {
	if s := SettingsFrom(configSection(t, "")); s.Every != time.Minute || s.Judge != (sharedcause.Options{}) {
		t.Errorf("defaults %+v: want every 1m and the judge's defaults (zero)", s)
	}
	s := SettingsFrom(configSection(t, "{every: 15s, window: 20s, labels: [rack], minFaultyGPUs: 3, minRatio: 2, alpha: 0.01}"))
	want := sharedcause.Options{Window: 20 * time.Second, SignatureWindow: 20 * time.Second, MinFaultyGPUs: 3, MinRatio: 2, Alpha: 0.01}
	if s.Every != 15*time.Second || !slices.Equal(s.Labels, []string{"rack"}) || s.Judge != want {
		t.Errorf("settings %+v, want every 15s, [rack], %+v", s, want)
	}
	if _, err := New(Options{Settings: s, Client: adapt.Clientset(fake.NewClientset()), Namespace: "ns"}); err != nil {
		t.Errorf("New with a window shorter than a signature's: %v", err)
	}
}
