package agent

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// restoreFromNodeReport completes the checkpoint restore at start (restored says whether
// Runtime.Restore loaded one). It logs what the checkpoint held that this release does not know
// (a newer release wrote it), and then, when the boot time is known, merges the sticky faults of
// the node's own report (restoreFromNode): all of them when there was no usable checkpoint,
// and, when the report is newer than the checkpoint, those the checkpoint lacks, because a
// checkpoint write that failed before a restart must not lose a fault that was reported.
func restoreFromNodeReport(ctx context.Context, opts Options, m *health.Monitor, checkpointPath string, restored bool) {
	logger := klog.FromContext(ctx)
	var checkpointTime time.Time
	if restored {
		// Runtime.Restore keeps neither the checkpoint's time nor its notes: read it again.
		// Nothing writes it before Run.
		cp, notes, err := health.ReadCheckpointNotes(checkpointPath)
		switch {
		case err != nil:
			logger.Error(err, "Could not read the restored checkpoint again; merging every fault the node's annotation reports for this boot", "path", checkpointPath)
		case !notes.Empty():
			logger.Info("The checkpoint holds what this release does not know; everything else is restored",
				"path", checkpointPath, "version", notes.Version, "supportedVersion", health.CheckpointVersion,
				"unknownFields", notes.UnknownFields, "skipped", notes.Skipped, "skippedEntries", notes.SkipReasons)
		}
		if err == nil {
			checkpointTime = cp.Time
		}
	}
	if opts.BootTime.IsZero() {
		return
	}
	res, err := restoreFromNode(ctx, opts.Client, opts.NodeName, m, nodeRestore{
		BootID: opts.BootID, BootTime: opts.BootTime, Now: opts.Clock.Now(), CheckpointTime: checkpointTime,
	})
	if len(res.Bad) > 0 {
		logger.Info("Skipped entries of the node's gpu-health annotation that do not decode",
			"annotation", gpuhealthv1.HealthKey, "count", len(res.Bad), "entries", res.Bad[:min(len(res.Bad), 16)])
	}
	switch {
	case err != nil && !restored:
		logger.Error(err, "Could not restore faults from the node's annotation either")
	case err != nil:
		logger.Error(err, "Could not merge faults from the node's annotation; the checkpoint's are restored")
	case res.Stale:
		logger.Info("The node's gpu-health annotation is not newer than the checkpoint; nothing merged", "checkpointTime", checkpointTime)
	case res.Faults > 0:
		logger.Info("Restored sticky faults from the node's gpu-health annotation", "gpus", res.GPUs, "faults", res.Faults, "checkpoint", restored)
	}
}

// nodeRestore is what restoreFromNode needs to know besides the Node.
type nodeRestore struct {
	BootID   string
	BootTime time.Time
	Now      time.Time
	// CheckpointTime is the Time of the checkpoint restored before (the tracker's latest signal
	// when it was saved); zero when none was restored, or it has none.
	CheckpointTime time.Time
}

// nodeRestoreResult is what restoreFromNode did.
type nodeRestoreResult struct {
	GPUs, Faults int // devices that got faults back, and how many faults
	// Stale is set when the report is not newer than the checkpoint: nothing was merged.
	Stale bool
	// Bad names the annotation's entries that do not decode, each with why; they were skipped.
	Bad []string
}

// restoreFromNode is the second line of defence behind the checkpoint: what this agent last
// reported on its Node (the gpuhealth.dev/gpu-health annotation) is the other record of its
// sticky faults. Faults reported after this boot began (since > BootTime) are rebuilt from their
// reasons under the policy: XIDs and lost GPUs, the faults no later reading brings back.
// Everything else (polled readings, recovery actions, drains) is read again by the agent anyway.
//
// With a checkpoint restored before, the report counts only when it is newer than the
// checkpoint. The report is one snapshot, and every Since in it is a signal's time on this
// node, as the checkpoint's Time is: when something in the report began at or after
// CheckpointTime, the report was written after the checkpoint was taken, and a fault it holds
// that the tracker lacks was raised after the checkpoint's last successful write. Only such
// faults are added: the report never clears or weakens a fault the checkpoint restored. (A new
// fault on a GPU whose worst fault is older than the checkpoint does not date the report; it is
// missed, and that GPU stays as unhealthy as its older fault makes it.)
func restoreFromNode(ctx context.Context, client kube.Interface, nodeName string, m *health.Monitor, in nodeRestore) (nodeRestoreResult, error) {
	var res nodeRestoreResult
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return res, fmt.Errorf("read node %s: %w", nodeName, err)
	}
	summaries, bad, err := gpuhealthv1.ParseHealthEach(node.Annotations[gpuhealthv1.HealthKey])
	res.Bad = bad
	if err != nil {
		return res, err
	}
	if !in.CheckpointTime.IsZero() && !reportedSince(summaries, in.CheckpointTime) {
		res.Stale = true
		return res, nil
	}
	type fault struct {
		uuid string
		typ  health.ConditionType
		code uint32
	}
	have := map[fault]bool{}
	for _, d := range m.Tracker().Snapshot().Devices {
		for _, c := range d.Conditions {
			have[fault{d.Device.UUID, c.Type, c.Code}] = true
		}
	}
	policy := m.Tracker().Policy()
	cp := health.Checkpoint{BootID: in.BootID, Time: in.Now}
	for _, uuid := range slices.Sorted(maps.Keys(summaries)) {
		s := summaries[uuid]
		if uuid == "" {
			res.Bad = append(res.Bad, `"": an entry without a UUID`)
			continue
		}
		if s.ParentUUID != "" {
			continue // MIG instances come back with their parent's inventory; an XID scoped to one is not rebuilt
		}
		// The GPU's history comes back from the report too (the tracker takes it only for a GPU
		// whose history it does not have), whatever the GPU's health.
		if s.History != nil && len(s.History.Recent) > 0 && !s.Missing {
			dev := health.Device{UUID: uuid, Index: s.Index, PCIBusID: s.PCIBusID, Model: s.Model}
			cp.Devices = append(cp.Devices, health.CheckpointedDevice{Device: dev, Conditions: []health.Condition{}, History: s.History.Recent})
		}
		if s.Health == health.Healthy.String() || s.Since == nil || !s.Since.After(in.BootTime) {
			continue
		}
		var conds []health.Condition
		for _, reason := range s.Reasons {
			if c, ok := conditionFromReason(policy, reason, *s.Since); ok && !have[fault{uuid, c.Type, c.Code}] {
				conds = append(conds, c)
			}
		}
		if len(conds) > 0 {
			dev := health.Device{UUID: uuid, Index: s.Index, PCIBusID: s.PCIBusID, Model: s.Model}
			cp.Devices = append(cp.Devices, health.CheckpointedDevice{Device: dev, Conditions: conds})
			res.GPUs++
			res.Faults += len(conds)
		}
	}
	if len(cp.Devices) == 0 {
		return res, nil
	}
	if err := m.Restore(cp, in.BootID, in.Now); err != nil {
		return nodeRestoreResult{Bad: bad}, err
	}
	return res, nil
}

// reportedSince reports whether anything in the report began at or after t. Equal counts: a
// fault raised at the checkpoint's own instant, after it was taken, must not be lost.
func reportedSince(summaries map[string]gpuhealthv1.GPUSummary, t time.Time) bool {
	for _, s := range summaries {
		if s.Since != nil && !s.Since.Before(t) {
			return true
		}
	}
	return false
}

// conditionFromReason rebuilds a sticky condition from a reported reason ("XID79", "GPULost").
func conditionFromReason(p *health.Policy, reason string, since time.Time) (health.Condition, bool) {
	const note = health.RestoredFromReportNote
	if reason == "GPULost" {
		r := p.Lost
		return health.Condition{Type: health.ConditionGPULost, Severity: r.Severity, ClearsOn: r.ClearsOn, Evict: r.Evict,
			RecommendedAction: r.Action, Reason: reason, Message: "the GPU is lost" + note, Since: since, LastSeen: since}, true
	}
	code, ok := strings.CutPrefix(reason, "XID")
	if !ok {
		return health.Condition{}, false
	}
	n, err := strconv.ParseUint(code, 10, 32)
	if err != nil {
		return health.Condition{}, false
	}
	r, _ := p.XIDRuleFor(uint32(n))
	if r.Severity == health.Healthy || r.FollowRecoveryAction || r.ClearsOn == health.ClearsOnRecovered {
		return health.Condition{}, false
	}
	return health.Condition{Type: health.ConditionXID, Code: uint32(n), Severity: r.Severity, ClearsOn: r.ClearsOn, Evict: r.Evict,
		RecommendedAction: r.Action, Reason: reason, Message: fmt.Sprintf("XID %d: %s%s", n, r.Description, note), Since: since, LastSeen: since}, true
}

// ReadBootTime returns when this machine booted (btime in /proc/stat).
func ReadBootTime() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, fmt.Errorf("read boot time: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "btime "); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("read boot time: %w", err)
			}
			return time.Unix(sec, 0), nil
		}
	}
	return time.Time{}, fmt.Errorf("read boot time: no btime in /proc/stat")
}
