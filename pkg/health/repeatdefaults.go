package health

import "time"

// Names of the default repeat rules, which are the reasons of what they raise.
const (
	ReasonRepeatedXID13    = "RepeatedXID13OnSameGPU"
	ReasonRepeatedXID31    = "RepeatedXID31OnSameGPU"
	ReasonRepeatedXID45    = "RepeatedXID45OnSameGPU"
	ReasonXIDSpreadOverGPU = "XIDSpreadOverGPUs"
)

// DefaultRepeatRules returns the repeat rules of the default profile (docs/xid-policy.md lists
// them with their sources). Application XIDs (13, 31, 45) change nothing once, but when they keep
// coming back on one GPU, in separate bursts, the card is the likely cause; when they show up on
// several GPUs of a node at once, the software is. Each call returns new slices.
func DefaultRepeatRules() []RepeatRule {
	sameGPU := func(name string, xid uint32, burst time.Duration, desc, source string) RepeatRule {
		return RepeatRule{
			Name: name, XIDs: []uint32{xid}, Count: 3, Window: time.Hour, Burst: burst,
			Severity: Degraded, ClearsOn: ClearsOnQuietPeriod, Action: ActionInspect,
			Description: desc, Source: source,
		}
	}
	return []RepeatRule{
		sameGPU(ReasonRepeatedXID13, 13, 15*time.Second,
			"graphics engine exceptions that keep returning on one GPU point at the GPU, not the application",
			"NVSentinel health-events-analyzer RepeatedXID13OnSameGPCAndTPC (bursts split by a 15 s gap); NVSentinel ADR-007"),
		sameGPU(ReasonRepeatedXID31, 31, 20*time.Second,
			"memory page faults that keep returning on one GPU point at the GPU, not the application",
			"NVSentinel health-events-analyzer RepeatedXID31OnSameGPU"),
		sameGPU(ReasonRepeatedXID45, 45, 20*time.Second,
			"preemptive cleanups that keep returning on one GPU follow errors of the GPU itself",
			"NVIDIA k8s-device-plugin PR #1333 (XID 45 correlates with genuine GPU issues); NVSentinel RepeatedXIDErrorOnSameGPU (repeats in separate bursts, 20 s gap)"),
		{
			Name: ReasonXIDSpreadOverGPU, XIDs: []uint32{13, 31, 43, 45}, GPUs: 3, Window: 10 * time.Minute,
			Burst:       10 * time.Second,
			Description: "application XIDs on several GPUs at once point at software (driver, CUDA image, job), not at one card",
			Source:      "NVSentinel health-events-analyzer RepeatedXID31OnDifferentGPU and RepeatedXID13OnDifferentGPCAndTPC; NVSentinel#1712 (XID 45 on every GPU of 288 nodes)",
		},
	}
}
