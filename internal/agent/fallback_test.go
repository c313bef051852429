package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

func TestConditionFromReason(t *testing.T) {
	p := health.DefaultPolicy()
	since := time.Unix(100, 0)
	for _, tc := range []struct {
		reason   string
		ok       bool
		clearsOn health.ClearsOn
		evict    bool
	}{
		{"XID79", true, health.ClearsOnNodeReboot, true},
		{"XID48", true, health.ClearsOnGPUReset, false},
		{"XID13", false, 0, false},  // application error: nothing to restore
		{"XID154", false, 0, false}, // follows the recovery action, which is read again
		{"GPULost", true, health.ClearsOnNodeReboot, true},
		{"TemperatureAtShutdown", false, 0, false}, // a polled reading comes back by itself
		{"XIDnope", false, 0, false},
	} {
		c, ok := conditionFromReason(p, tc.reason, since)
		if ok != tc.ok || (ok && (c.ClearsOn != tc.clearsOn || c.Evict != tc.evict || !c.Since.Equal(since) || c.Reason != tc.reason)) {
			t.Errorf("%s: %+v, %v", tc.reason, c, ok)
		}
	}
}

func TestReadBootTime(t *testing.T) {
	bt, err := ReadBootTime()
	if err != nil {
		t.Skipf("no /proc/stat here: %v", err)
	}
	if !bt.Before(time.Now()) || bt.Before(time.Unix(0, 0).Add(time.Hour)) {
		t.Errorf("boot time %v is not plausible", bt)
	}
}

// The restore tests run on one timeline: the node booted at bootAt, and the agent restarts an
// hour later.
var bootAt = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func after(d time.Duration) time.Time { return bootAt.Add(d) }

const testNode = "node-a"

func restoreGPUs() []health.Device {
	var out []health.Device
	for i := range 3 {
		out = append(out, health.Device{UUID: fmt.Sprintf("GPU-%d", i), Index: i, Minor: i, Model: "Test GPU"})
	}
	return out
}

// previousRun is the agent before the restart; the tests take from it the checkpoint it last
// saved and the report it last wrote on the Node, at the moments the scenario says.
type previousRun struct {
	t  *testing.T
	tr *health.Tracker
}

func newPreviousRun(t *testing.T, bootID string) *previousRun {
	t.Helper()
	tr, err := health.NewTracker(health.DefaultPolicy(), restoreGPUs())
	if err != nil {
		t.Fatal(err)
	}
	tr.SetBootID(bootID)
	return &previousRun{t: t, tr: tr}
}

func (p *previousRun) signal(s health.Signal) {
	p.t.Helper()
	if _, err := p.tr.Observe(s, nil); err != nil {
		p.t.Fatal(err)
	}
}

func (p *previousRun) xid(uuid string, xid uint32, d time.Duration) {
	p.t.Helper()
	p.signal(health.XIDSignal(uuid, xid, after(d)))
}

func (p *previousRun) reset(uuid string, d time.Duration) {
	p.t.Helper()
	p.signal(health.Signal{Kind: health.SignalReset, Device: uuid, Time: after(d)})
}

// report is the gpu-health annotation the annotation reporter writes for the current state.
func (p *previousRun) report() string {
	p.t.Helper()
	b, err := json.Marshal(gpuhealthv1.Summaries(p.tr.Snapshot()))
	if err != nil {
		p.t.Fatal(err)
	}
	return string(b)
}

func nodeClient(annotations map[string]string) kube.Interface {
	return adapt.Clientset(fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Annotations: annotations}}))
}

// restarted is a monitor as the agent has it at start: the checkpoint cp restored (none when
// nil), as Runtime.Restore does.
func restarted(t *testing.T, cp *health.Checkpoint, bootID string) *health.Monitor {
	t.Helper()
	tr, err := health.NewTracker(health.DefaultPolicy(), restoreGPUs())
	if err != nil {
		t.Fatal(err)
	}
	tr.SetBootID(bootID)
	m := health.NewMonitor(tr)
	if cp != nil {
		if err := m.Restore(*cp, bootID, after(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// faultsOf lists the monitor's conditions, sorted; a condition rebuilt from the report says so.
func faultsOf(m *health.Monitor) []string {
	var out []string
	for _, d := range m.Tracker().Snapshot().Devices {
		for _, c := range d.Conditions {
			from := "checkpoint"
			if strings.Contains(c.Message, "restored from the node's gpu-health annotation") {
				from = "report"
			}
			out = append(out, fmt.Sprintf("%s %s/%d %v since=%v from %s", d.Device.UUID, c.Type, c.Code, c.Severity, c.Since.Sub(bootAt), from))
		}
	}
	slices.Sort(out)
	return out
}

func TestRestoreFromNodeMergesReportsNewerThanTheCheckpoint(t *testing.T) {
	cases := []struct {
		name string
		// run plays the previous agent and returns the checkpoint it last saved (nil: none
		// usable) and the report it last wrote.
		run    func(t *testing.T) (*health.Checkpoint, string)
		bootID string
		want   []string
		stale  bool
	}{
		{
			name: "no checkpoint: every sticky fault reported in this boot",
			run: func(t *testing.T) (*health.Checkpoint, string) {
				p := newPreviousRun(t, "boot-1")
				p.xid("GPU-0", 48, time.Minute)
				p.xid("GPU-1", 13, 2*time.Minute) // an application error: nothing to restore
				p.xid("GPU-2", 79, 3*time.Minute)
				return nil, p.report()
			},
			want: []string{"GPU-0 XID/48 Unhealthy since=1m0s from report", "GPU-2 XID/79 Unhealthy since=3m0s from report"},
		},
		{
			name: "a fault raised after the last checkpoint that was saved",
			run: func(t *testing.T) (*health.Checkpoint, string) {
				p := newPreviousRun(t, "boot-1")
				p.xid("GPU-0", 48, time.Minute)
				cp := p.tr.Checkpoint()
				p.xid("GPU-1", 79, 2*time.Minute) // the checkpoint write fails; the report is written
				return &cp, p.report()
			},
			want: []string{"GPU-0 XID/48 Unhealthy since=1m0s from checkpoint", "GPU-1 XID/79 Unhealthy since=2m0s from report"},
		},
		{
			name: "a fault raised at the instant the checkpoint was taken, after it",
			run: func(t *testing.T) (*health.Checkpoint, string) {
				p := newPreviousRun(t, "boot-1")
				p.xid("GPU-0", 48, time.Minute)
				cp := p.tr.Checkpoint()
				p.xid("GPU-1", 79, time.Minute)
				return &cp, p.report()
			},
			want: []string{"GPU-0 XID/48 Unhealthy since=1m0s from checkpoint", "GPU-1 XID/79 Unhealthy since=1m0s from report"},
		},
		{
			name: "a report older than the checkpoint does not bring back a fault a reset ended",
			run: func(t *testing.T) (*health.Checkpoint, string) {
				p := newPreviousRun(t, "boot-1")
				p.xid("GPU-0", 48, time.Minute)
				report := p.report()
				p.reset("GPU-0", 2*time.Minute) // saved; the annotation write fails
				cp := p.tr.Checkpoint()
				return &cp, report
			},
			stale: true,
		},
		{
			name: "the report never clears or replaces a fault the checkpoint has",
			run: func(t *testing.T) (*health.Checkpoint, string) {
				p := newPreviousRun(t, "boot-1")
				p.xid("GPU-0", 48, time.Minute)
				p.xid("GPU-1", 79, 2*time.Minute)
				cp := p.tr.Checkpoint()
				p.reset("GPU-0", 3*time.Minute) // neither saved...
				p.xid("GPU-2", 79, 4*time.Minute)
				return &cp, p.report() // ...but reported: GPU 0 healthy
			},
			want: []string{
				"GPU-0 XID/48 Unhealthy since=1m0s from checkpoint",
				"GPU-1 XID/79 Unhealthy since=2m0s from checkpoint",
				"GPU-2 XID/79 Unhealthy since=4m0s from report",
			},
		},
		{
			name: "a checkpoint of the previous boot: this boot's reported faults come back beside its admin faults",
			run: func(t *testing.T) (*health.Checkpoint, string) {
				p0 := newPreviousRun(t, "boot-0")
				p0.xid("GPU-0", 48, -2*time.Hour)
				p0.tr.SetDrains(map[string]string{"GPU-2": "drained by alice"}, after(-90*time.Minute), nil)
				cp := p0.tr.Checkpoint()
				// The first agent of this boot restored it and reported XID 79, but never
				// saved a checkpoint of this boot.
				p := newPreviousRun(t, "boot-1")
				if _, err := p.tr.Restore(cp, "boot-1", after(time.Minute), nil); err != nil {
					t.Fatal(err)
				}
				p.xid("GPU-1", 79, 5*time.Minute)
				return &cp, p.report()
			},
			want: []string{"GPU-1 XID/79 Unhealthy since=5m0s from report", "GPU-2 Admin/0 Unhealthy since=-1h30m0s from checkpoint"},
		},
		{
			name: "a report of the previous boot adds nothing",
			run: func(t *testing.T) (*health.Checkpoint, string) {
				p := newPreviousRun(t, "boot-0")
				p.xid("GPU-0", 48, -time.Hour)
				return nil, p.report()
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp, report := tc.run(t)
			m := restarted(t, cp, "boot-1")
			in := nodeRestore{BootID: "boot-1", BootTime: bootAt, Now: after(time.Hour)}
			if cp != nil {
				in.CheckpointTime = cp.Time
			}
			res, err := restoreFromNode(context.Background(), nodeClient(map[string]string{gpuhealthv1.HealthKey: report}), testNode, m, in)
			if err != nil {
				t.Fatal(err)
			}
			if got := faultsOf(m); !slices.Equal(got, tc.want) {
				t.Errorf("faults after the restore\n got %q\nwant %q", got, tc.want)
			}
			if res.Stale != tc.stale || len(res.Bad) > 0 {
				t.Errorf("result %+v, want stale %v and no bad entries", res, tc.stale)
			}
		})
	}
}

func TestRestoreFromNodeBadReportsCostOnlyThemselves(t *testing.T) {
	p := newPreviousRun(t, "boot-1")
	p.xid("GPU-0", 48, time.Minute)
	cp := p.tr.Checkpoint()
	p.xid("GPU-1", 79, 2*time.Minute)
	good := p.report()
	var entries map[string]json.RawMessage
	if err := json.Unmarshal([]byte(good), &entries); err != nil {
		t.Fatal(err)
	}
	entries["GPU-2"] = json.RawMessage(`{"index":"two","health":"Unhealthy","reasons":["XID79"],"since":"2026-03-01T10:03:00Z"}`)
	entries[""] = json.RawMessage(`{"index":3,"health":"Unhealthy","reasons":["XID79"],"since":"2026-03-01T10:03:00Z"}`)
	damaged, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	fromCheckpoint := "GPU-0 XID/48 Unhealthy since=1m0s from checkpoint"
	cases := []struct {
		name    string
		client  kube.Interface
		want    []string
		bad     []string
		wantErr string
	}{
		{name: "no annotation", client: nodeClient(nil), want: []string{fromCheckpoint}},
		{name: "not JSON", client: nodeClient(map[string]string{gpuhealthv1.HealthKey: "{XID79"}),
			want: []string{fromCheckpoint}, wantErr: gpuhealthv1.HealthKey},
		{name: "not an object", client: nodeClient(map[string]string{gpuhealthv1.HealthKey: `["GPU-1"]`}),
			want: []string{fromCheckpoint}, wantErr: gpuhealthv1.HealthKey},
		{name: "damaged entries", client: nodeClient(map[string]string{gpuhealthv1.HealthKey: string(damaged)}),
			want: []string{fromCheckpoint, "GPU-1 XID/79 Unhealthy since=2m0s from report"},
			bad:  []string{`"": an entry without a UUID`, `"GPU-2": `}},
		{name: "no node", client: adapt.Clientset(fake.NewClientset()), want: []string{fromCheckpoint}, wantErr: "read node " + testNode},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := restarted(t, &cp, "boot-1")
			res, err := restoreFromNode(context.Background(), tc.client, testNode, m,
				nodeRestore{BootID: "boot-1", BootTime: bootAt, Now: after(time.Hour), CheckpointTime: cp.Time})
			if (err != nil) != (tc.wantErr != "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want one naming %q", err, tc.wantErr)
			}
			if got := faultsOf(m); !slices.Equal(got, tc.want) {
				t.Errorf("faults\n got %q\nwant %q", got, tc.want)
			}
			if len(res.Bad) != len(tc.bad) {
				t.Fatalf("bad entries %q, want %q", res.Bad, tc.bad)
			}
			for _, prefix := range tc.bad {
				if !slices.ContainsFunc(res.Bad, func(b string) bool { return strings.HasPrefix(b, prefix) }) {
					t.Errorf("bad entries %q, want one starting %q", res.Bad, prefix)
				}
			}
		})
	}
}

// TestRestoreAtStart runs the agent's start sequence: Runtime.Restore on a checkpoint file, then
// restoreFromNodeReport.
func TestRestoreAtStart(t *testing.T) {
	p := newPreviousRun(t, "boot-1")
	p.xid("GPU-0", 48, time.Minute)
	saved, err := health.MarshalCheckpoint(p.tr.Checkpoint())
	if err != nil {
		t.Fatal(err)
	}
	p.xid("GPU-1", 79, 2*time.Minute) // the checkpoint write fails
	client := nodeClient(map[string]string{gpuhealthv1.HealthKey: p.report()})
	// A newer release's checkpoint names a newer version; its data is the same.
	newer := bytes.Replace(saved, []byte(fmt.Sprintf(`"version": %d,`, health.CheckpointVersion)),
		[]byte(fmt.Sprintf(`"version": %d,`, health.CheckpointVersion+1)), 1)
	if bytes.Equal(newer, saved) {
		t.Fatal("no version in the checkpoint")
	}
	both := []string{"GPU-0 XID/48 Unhealthy since=1m0s from checkpoint", "GPU-1 XID/79 Unhealthy since=2m0s from report"}
	cases := []struct {
		name     string
		file     []byte // nil: no checkpoint file
		bootTime time.Time
		want     []string
		logs     []string
	}{
		{name: "the report is newer than the checkpoint", file: saved, bootTime: bootAt, want: both,
			logs: []string{`"msg"="Restored sticky faults from the node's gpu-health annotation" "gpus"=1 "faults"=1 "checkpoint"=true`}},
		{name: "a newer release's checkpoint", file: newer, bootTime: bootAt, want: both,
			logs: []string{`"msg"="The checkpoint holds what this release does not know`, fmt.Sprintf(`"version"=%d "supportedVersion"=%d`, health.CheckpointVersion+1, health.CheckpointVersion)}},
		{name: "no boot time: only the checkpoint", file: newer, want: []string{"GPU-0 XID/48 Unhealthy since=1m0s from checkpoint"},
			logs: []string{fmt.Sprintf(`"version"=%d`, health.CheckpointVersion+1)}},
		{name: "a corrupt checkpoint: everything reported in this boot", file: []byte("{not a checkpoint"), bootTime: bootAt,
			want: []string{"GPU-0 XID/48 Unhealthy since=1m0s from report", "GPU-1 XID/79 Unhealthy since=2m0s from report"},
			logs: []string{`"checkpoint"=false`}},
		{name: "no checkpoint: everything reported in this boot", bootTime: bootAt,
			want: []string{"GPU-0 XID/48 Unhealthy since=1m0s from report", "GPU-1 XID/79 Unhealthy since=2m0s from report"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "checkpoint.json")
			if tc.file != nil {
				if err := os.WriteFile(path, tc.file, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			rt, err := health.NewRuntime(health.DefaultPolicy(), restoreGPUs(), health.RuntimeOptions{CheckpointPath: path, BootID: "boot-1"})
			if err != nil {
				t.Fatal(err)
			}
			restored, _ := rt.Restore() // a corrupt checkpoint is the agent's to report, not this test's
			var logs healthtest.Log
			opts := Options{NodeName: testNode, Client: client, BootID: "boot-1", BootTime: tc.bootTime, Clock: clocktesting.NewFakeClock(after(time.Hour))}
			restoreFromNodeReport(logs.Context(), opts, rt.Monitor(), path, restored)
			if got := faultsOf(rt.Monitor()); !slices.Equal(got, tc.want) {
				t.Errorf("faults\n got %q\nwant %q", got, tc.want)
			}
			for _, want := range tc.logs {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("the log does not say %s:\n%s", want, logs.String())
				}
			}
		})
	}
}
