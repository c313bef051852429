// Package simulate replays a scenario through the health library on virtual time and reports
// the final state and every transition: the engine behind `gpuhealth simulate`.
package simulate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Result is the output of a replay. Its JSON shape is a contract (see docs/scenario.md):
// durations are offsets from the scenario's start, devices are ordered by index.
type Result struct {
	Node        string       `json:"node"`
	BootID      string       `json:"bootID"`
	End         Offset       `json:"end"`
	Signals     uint64       `json:"signals"`
	Devices     []Device     `json:"devices"`
	Transitions []Transition `json:"transitions"`
	// Findings are the node findings in effect at the end (an XID spread over several GPUs).
	Findings []Finding `json:"findings,omitempty"`
}

// Finding is a fact about the node as a whole that changes no GPU's health.
type Finding struct {
	Reason   string   `json:"reason"`
	Message  string   `json:"message"`
	Since    Offset   `json:"since"`
	LastSeen Offset   `json:"lastSeen"`
	GPUs     []string `json:"gpus"`
}

// Device is one GPU's final state.
type Device struct {
	Index    int    `json:"index"`
	UUID     string `json:"uuid"`
	PCIBusID string `json:"pciBusID,omitempty"`
	Model    string `json:"model,omitempty"`
	// Missing marks a GPU of gpus.missing: on the bus, but the driver answers nothing for it.
	Missing    bool        `json:"missing,omitempty"`
	Health     string      `json:"health"`
	Evict      bool        `json:"evict"`
	Conditions []Condition `json:"conditions"`
	XIDs       []XIDCount  `json:"xids,omitempty"`
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
}

// MIGDevice is one MIG instance's final state.
type MIGDevice struct {
	UUID            string      `json:"uuid"`
	GPUInstance     uint32      `json:"gpuInstance"`
	ComputeInstance uint32      `json:"computeInstance"`
	Health          string      `json:"health"`
	Evict           bool        `json:"evict"`
	Conditions      []Condition `json:"conditions"`
	XIDs            []XIDCount  `json:"xids,omitempty"`
}

// Condition is a condition in effect at the end.
type Condition struct {
	Type              string `json:"type"`
	Severity          string `json:"severity"`
	Reason            string `json:"reason"`
	Message           string `json:"message"`
	Since             Offset `json:"since"`
	ClearsOn          string `json:"clearsOn"`
	RecommendedAction string `json:"recommendedAction"`
	Evict             bool   `json:"evict,omitempty"`
}

// XIDCount is how often an XID was seen.
type XIDCount struct {
	XID      uint32 `json:"xid"`
	Count    uint64 `json:"count"`
	LastSeen Offset `json:"lastSeen"`
}

// Transition is a change of a device's health.
type Transition struct {
	At         Offset `json:"at"`
	Index      int    `json:"index"`
	UUID       string `json:"uuid"`
	ParentUUID string `json:"parentUUID,omitempty"`
	From       string `json:"from"`
	To         string `json:"to"`
	Reason     string `json:"reason"`
}

// Offset is a duration from the scenario's start, written as a Go duration ("1m30s").
type Offset time.Duration

// MarshalText implements encoding.TextMarshaler.
func (o Offset) MarshalText() ([]byte, error) { return []byte(time.Duration(o).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (o *Offset) UnmarshalText(b []byte) error {
	d, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*o = Offset(d)
	return nil
}

// Options for Run.
type Options struct {
	SampleInterval time.Duration
}

// Recorder feeds a health tracker with the signals of any backend (it is a gpu.Sink, with the
// simulator's PeerSink and the NVML backend's CheckSink) and keeps every transition, so that a
// replay through either backend ends in a Result. It is safe for concurrent use: the NVML
// backend signals from its sampler and its event loop at once.
type Recorder struct {
	tracker *health.Tracker
	start   time.Time

	mu          sync.Mutex
	buf         []health.Transition
	transitions []health.Transition
	signals     uint64
	err         error
}

var (
	_ gpu.Sink     = (*Recorder)(nil)
	_ sim.PeerSink = (*Recorder)(nil)
)

// NewRecorder returns a recorder for devices under policy; start is the scenario's 0s, which
// the Result's offsets count from.
func NewRecorder(policy *health.Policy, devices []health.Device, bootID string, start time.Time) (*Recorder, error) {
	tracker, err := health.NewTracker(policy, devices)
	if err != nil {
		return nil, err
	}
	tracker.SetBootID(bootID)
	return &Recorder{tracker: tracker, start: start}, nil
}

// Signal observes one signal.
func (r *Recorder) Signal(s health.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signals++
	var err error
	r.buf, err = r.tracker.Observe(s, r.buf[:0])
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("signal %s for %s: %w", s.Kind, s.Device, err)
	}
	r.transitions = append(r.transitions, r.buf...)
}

// Reboot starts a new boot.
func (r *Recorder) Reboot(bootID string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.transitions = append(r.transitions, r.tracker.Reboot(bootID, at, nil)...)
}

// SetPeerFaults applies the peer nodes' faults (sim.PeerSink).
func (r *Recorder) SetPeerFaults(faults []health.PeerFault, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	r.buf, err = r.tracker.SetPeerFaults(faults, at, r.buf[:0])
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("peer faults: %w", err)
	}
	r.transitions = append(r.transitions, r.buf...)
}

// SetUnmonitored marks a device whose events cannot be watched.
func (r *Recorder) SetUnmonitored(uuid string, unmonitored bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.tracker.SetUnmonitored(uuid, unmonitored); err != nil && r.err == nil {
		r.err = err
	}
}

// SetCheckUnmonitored marks one check a backend cannot run on a device.
func (r *Recorder) SetCheckUnmonitored(uuid string, check health.Check, unmonitored bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.tracker.SetCheckUnmonitored(uuid, check, unmonitored); err != nil && r.err == nil {
		r.err = err
	}
}

// Result ends the replay at end: time-based conditions are evaluated then, and the final state
// and every transition are returned, or the first signal the tracker refused.
func (r *Recorder) Result(node string, end time.Time) (*Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	r.transitions = r.tracker.Tick(end, r.transitions)
	return buildResult(node, end, r, r.tracker.Snapshot()), nil
}

// Run replays sc under policy on virtual time.
func Run(ctx context.Context, sc *sim.Scenario, policy *health.Policy, opts Options) (*Result, error) {
	backend := sim.New(sc, sim.Options{Virtual: true, SampleInterval: opts.SampleInterval, Settle: settle(policy, opts.SampleInterval)})
	start := time.Unix(0, 0).UTC()
	rec, err := NewRecorder(policy, slices.Concat(backend.Devices(), backend.Placeholders()), backend.BootID(), start)
	if err != nil {
		return nil, err
	}
	if err := backend.Run(ctx, rec); err != nil {
		return nil, err
	}
	return rec.Result(sc.Node, start.Add(backend.End()))
}

// End is where Run ends sc under policy, as an offset from the start: the scenario's duration,
// or its last event and enough sampling rounds for every hysteresis window to close.
func End(sc *sim.Scenario, policy *health.Policy, sampleInterval time.Duration) time.Duration {
	return sc.End(settle(policy, sampleInterval))
}

// settle is long enough for every polled check's hysteresis window to close after the last
// event: the largest recoverySamples, plus one round for the sample that starts the count.
func settle(p *health.Policy, interval time.Duration) time.Duration {
	if interval <= 0 {
		interval = sim.DefaultSampleEvery
	}
	n := max(p.Thermal.RecoverySamples, p.ClockEvents.RecoverySamples, p.PCIeReplays.RecoverySamples,
		p.NVLink.RecoverySamples, health.DefaultRecoverySamples)
	return time.Duration(n+1) * interval
}

func buildResult(node string, end time.Time, rec *Recorder, snap health.Snapshot) *Result {
	off := func(t time.Time) Offset { return Offset(t.Sub(rec.start)) }
	res := &Result{Node: node, BootID: snap.BootID, End: off(end), Signals: rec.signals,
		Devices: []Device{}, Transitions: []Transition{}}
	conds := func(cs []health.Condition) []Condition {
		out := make([]Condition, 0, len(cs))
		for _, c := range cs {
			out = append(out, Condition{
				Type: string(c.Type), Severity: c.Severity.String(), Reason: c.Reason, Message: c.Message,
				Since: off(c.Since), ClearsOn: c.ClearsOn.String(), RecommendedAction: string(c.RecommendedAction), Evict: c.Evict,
			})
		}
		return out
	}
	xids := func(xs []health.XIDCount) []XIDCount {
		var out []XIDCount
		for _, x := range xs {
			out = append(out, XIDCount{XID: x.XID, Count: x.Count, LastSeen: off(x.LastSeen)})
		}
		return out
	}
	for _, d := range snap.Devices {
		if d.Device.MIG != nil {
			parent := &res.Devices[len(res.Devices)-1]
			parent.MIGDevices = append(parent.MIGDevices, MIGDevice{
				UUID: d.Device.UUID, GPUInstance: d.Device.MIG.GPUInstance, ComputeInstance: d.Device.MIG.ComputeInstance,
				Health: d.Health.String(), Evict: d.Evict, Conditions: conds(d.Conditions), XIDs: xids(d.XIDs),
			})
			continue
		}
		res.Devices = append(res.Devices, Device{
			Index: d.Device.Index, UUID: d.Device.UUID, PCIBusID: d.Device.PCIBusID, Model: d.Device.Model, Missing: d.Device.Missing,
			Health: d.Health.String(), Evict: d.Evict, Conditions: conds(d.Conditions), XIDs: xids(d.XIDs),
		})
	}
	for _, f := range snap.Findings {
		res.Findings = append(res.Findings, Finding{Reason: f.Reason, Message: f.Message, Since: off(f.Since), LastSeen: off(f.LastSeen), GPUs: f.GPUs})
	}
	for _, t := range rec.transitions {
		tr := Transition{At: off(t.Time), Index: t.Device.Index, UUID: t.Device.UUID,
			From: t.From.String(), To: t.To.String(), Reason: t.Reason}
		if t.Device.MIG != nil {
			tr.ParentUUID = t.Device.MIG.ParentUUID
		}
		res.Transitions = append(res.Transitions, tr)
	}
	return res
}

// WriteJSON writes the result as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the result for people: the final state, then the transitions.
func (r *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "NODE %s — final state at %s (%d signals)\n", r.Node, time.Duration(r.End), r.Signals)
	fmt.Fprintln(tw, "INDEX\tUUID\tHEALTH\tEVICT\tREASONS")
	row := func(index, uuid, healthStr string, evict bool, cs []Condition) {
		reasons := make([]string, 0, len(cs))
		for _, c := range cs {
			reasons = append(reasons, fmt.Sprintf("%s(%s, since %s, until %s)", c.Reason, c.Severity, time.Duration(c.Since), c.ClearsOn))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\n", index, uuid, healthStr, evict, strings.Join(reasons, " "))
	}
	for _, d := range r.Devices {
		index := strconv.Itoa(d.Index)
		if d.Missing {
			index = "missing"
		}
		row(index, d.UUID, d.Health, d.Evict, d.Conditions)
		for _, m := range d.MIGDevices {
			row(fmt.Sprintf("%d/gi%d/ci%d", d.Index, m.GPUInstance, m.ComputeInstance), m.UUID, m.Health, m.Evict, m.Conditions)
		}
	}
	if len(r.Findings) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintf(tw, "NODE FINDINGS (%d)\n", len(r.Findings))
		fmt.Fprintln(tw, "REASON\tSINCE\tGPUS\tMESSAGE")
		for _, f := range r.Findings {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Reason, time.Duration(f.Since), strings.Join(f.GPUs, ","), f.Message)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "TRANSITIONS (%d)\n", len(r.Transitions))
	fmt.Fprintln(tw, "AT\tINDEX\tUUID\tFROM\tTO\tREASON")
	for _, t := range r.Transitions {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", time.Duration(t.At), t.Index, t.UUID, t.From, t.To, t.Reason)
	}
	return tw.Flush()
}
