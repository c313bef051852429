package agent

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// restoreFromNode is the second line of defence when the checkpoint is missing or cannot be
// trusted: what this agent last reported on its Node (the gpuhealth.dev/gpu-health annotation)
// is the other record of its sticky faults. Faults reported after this boot began (since >
// bootTime) are rebuilt from their reasons under the policy: XIDs and lost GPUs, the faults no
// later reading brings back. Everything else (polled readings, recovery actions, drains) is read
// again by the agent anyway. It returns how many devices got a fault back.
func restoreFromNode(ctx context.Context, client kube.Interface, nodeName string, m *health.Monitor, bootID string, bootTime, now time.Time) (int, error) {
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("read node %s: %w", nodeName, err)
	}
	value := node.Annotations[gpuhealthv1.HealthKey]
	if value == "" {
		return 0, nil
	}
	summaries, err := gpuhealthv1.ParseHealth(value)
	if err != nil {
		return 0, err
	}
	policy := m.Tracker().Policy()
	cp := health.Checkpoint{BootID: bootID, Time: now}
	for uuid, s := range summaries {
		if s.Health == health.Healthy.String() || s.Since == nil || !s.Since.After(bootTime) {
			continue
		}
		var conds []health.Condition
		for _, reason := range s.Reasons {
			if c, ok := conditionFromReason(policy, reason, *s.Since); ok {
				conds = append(conds, c)
			}
		}
		if len(conds) > 0 {
			dev := health.Device{UUID: uuid, Index: s.Index, PCIBusID: s.PCIBusID, Model: s.Model}
			if s.ParentUUID != "" {
				continue // MIG instances come back with their parent's inventory; an XID scoped to one is not rebuilt
			}
			cp.Devices = append(cp.Devices, health.CheckpointedDevice{Device: dev, Conditions: conds})
		}
	}
	if len(cp.Devices) == 0 {
		return 0, nil
	}
	if err := m.Restore(cp, bootID, now); err != nil {
		return 0, err
	}
	return len(cp.Devices), nil
}

// conditionFromReason rebuilds a sticky condition from a reported reason ("XID79", "GPULost").
func conditionFromReason(p *health.Policy, reason string, since time.Time) (health.Condition, bool) {
	const note = " (restored from the node's gpu-health annotation)"
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
