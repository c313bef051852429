package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// recordsByName serves Get from a map; a name mapped to nil is Forbidden.
type recordsByName struct {
	kube.GPURecordInterface
	records map[string]*gpurecord.GPURecord
	gets    int
}

func (r *recordsByName) Get(_ context.Context, name string, _ metav1.GetOptions) (*gpurecord.GPURecord, error) {
	r.gets++
	gr := schema.GroupResource{Group: gpurecord.Group, Resource: gpurecord.Resource}
	rec, ok := r.records[name]
	switch {
	case !ok:
		return nil, apierrors.NewNotFound(gr, name)
	case rec == nil:
		return nil, apierrors.NewForbidden(gr, name, nil)
	}
	return rec.DeepCopy(), nil
}

func TestOffenderCheckMarksAGPUWithAPastOnce(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	devices := []health.Device{
		{UUID: "GPU-a", Index: 0, Serial: "1650000000000"}, // failed twice on node-x
		{UUID: "GPU-b", Index: 1, Serial: "1650000000001"}, // no record
		{UUID: "GPU-c", Index: 2},                          // no serial: not looked up
		{UUID: "GPU-d", Index: 3, Serial: "1650000000003"}, // a record of another serial by its name
	}
	fault := func(d time.Duration) gpurecord.Event {
		return gpurecord.Event{Time: metav1.NewTime(t0.Add(-d)), Kind: gpurecord.EventFault, Reason: "XID79", Node: "node-x", Index: 4}
	}
	records := &recordsByName{records: map[string]*gpurecord.GPURecord{
		"1650000000000": {Serial: "1650000000000", Events: []gpurecord.Event{fault(48 * time.Hour), fault(time.Hour)}},
		"1650000000003": {Serial: "other"},
	}}
	tr, err := health.NewTracker(health.DefaultPolicy(), devices)
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	events := record.NewFakeRecorder(10)
	check := &offenderCheck{records: records, rule: gpurecord.RepeatOffenderRule{Faults: 2, Within: 7 * 24 * time.Hour}, devices: devices,
		monitor: m, clock: clocktesting.NewFakeClock(t0), recorder: events, nodeRef: &corev1.ObjectReference{Kind: "Node", Name: "node-y"}}
	if err := check.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if records.gets != 3 {
		t.Errorf("%d records read, want 3 (one per GPU with a serial)", records.gets)
	}
	byUUID := map[string]health.DeviceStatus{}
	for _, d := range m.Snapshot().Devices {
		byUUID[d.Device.UUID] = d
	}
	a := byUUID["GPU-a"]
	if a.Health != health.Degraded || len(a.Conditions) != 1 || a.Conditions[0].Type != health.ConditionRepeatOffender ||
		!strings.Contains(a.Conditions[0].Message, "2 faults within 168h0m0s on node node-x") {
		t.Fatalf("GPU-a: %+v", a)
	}
	for _, u := range []string{"GPU-b", "GPU-c", "GPU-d"} {
		if byUUID[u].Health != health.Healthy {
			t.Errorf("%s: %+v, want Healthy", u, byUUID[u])
		}
	}
	if e := <-events.Events; !strings.Contains(e, "Warning GPURepeatOffender GPU 0: board serial 1650000000000") {
		t.Errorf("Event %q", e)
	}

	// Cleared by an administrator, then the agent restarts: the same past is not raised again.
	if _, err := m.ClearCondition("GPU-a", health.ConditionRepeatOffender, 0, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := check.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := m.Snapshot().Devices[0]; d.Health != health.Healthy {
		t.Fatalf("raised again after a clear: %+v", d)
	}
	// A new fault (on another node) is a new verdict.
	records.records["1650000000000"].Events = append(records.records["1650000000000"].Events, fault(0))
	if err := check.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := m.Snapshot().Devices[0]; d.Health != health.Degraded {
		t.Fatalf("a new fault raised nothing: %+v", d)
	}

	// An agent that may not read records gives up at once, marking nothing.
	records.records["1650000000000"] = nil
	records.gets = 0
	if err := check.run(context.Background()); err != nil || records.gets != 1 {
		t.Fatalf("Forbidden: err %v after %d reads", err, records.gets)
	}
}
