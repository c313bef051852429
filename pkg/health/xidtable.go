package health

// XIDTable returns the built-in XID table, which follows the recommended actions of NVIDIA's XID
// catalog (docs/xid-policy.md lists it):
//
//   - application errors (13, 31, 43, 45, 68, 69, 94) leave health unchanged; they are counted
//     and visible;
//   - 63 (row remap recorded) is Degraded until a GPU reset, 92 (excess single-bit ECC) is
//     Degraded until a quiet period passes;
//   - reset-class XIDs are Unhealthy until the GPU is reset;
//   - 79 (fallen off the bus), 151 and 160 are Unhealthy with eviction until the node reboots;
//   - 54 (auxiliary power) is Unhealthy until the node reboots, pending a hardware check;
//   - 154 defers to NVML's GPU recovery action.
//
// XIDs not in the table fall to Policy.UnknownXID (Unhealthy until reset by default: fail safe).
// Each call returns a new map the caller may change.
func XIDTable() map[uint32]XIDRule {
	t := map[uint32]XIDRule{}
	app := func(desc string, xids ...uint32) {
		for _, x := range xids {
			t[x] = XIDRule{Severity: Healthy, ClearsOn: ClearsOnGPUReset, Action: ActionRestartApplication, Description: desc}
		}
	}
	reset := func(desc string, xids ...uint32) {
		for _, x := range xids {
			t[x] = XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnGPUReset, Action: ActionResetGPU, Description: desc}
		}
	}
	reboot := func(desc string, xids ...uint32) {
		for _, x := range xids {
			t[x] = XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnNodeReboot, Evict: true, Action: ActionRebootNode, Description: desc}
		}
	}

	app("graphics engine exception", 13)
	app("GPU memory page fault", 31)
	app("GPU stopped processing", 43)
	app("preemptive cleanup due to previous errors", 45)
	app("video decoder exception", 68)
	app("graphics engine class error", 69)
	app("contained ECC error", 94)

	t[63] = XIDRule{Severity: Degraded, ClearsOn: ClearsOnGPUReset, Action: ActionResetGPU, Description: "ECC page retirement or row remapping recorded"}
	t[92] = XIDRule{Severity: Degraded, ClearsOn: ClearsOnQuietPeriod, Action: ActionInspect, Description: "high single-bit ECC error rate"}

	reset("GPU stopped processing", 46)
	reset("double-bit ECC error", 48)
	reset("internal micro-controller halt", 62)
	reset("ECC page retirement or row remapper recording failure", 64)
	reset("NVLink error", 74)
	reset("uncontained ECC error", 95)
	reset("context switch timeout", 109)
	reset("security fault error", 110)
	reset("GSP RPC timeout", 119)
	reset("GSP error", 120)
	reset("GPU reset required", 136)
	reset("unrecovered ECC error", 140)
	reset("GPU initialization failure", 143)
	reset("NVLink error", 144, 145, 146, 147, 148, 149, 150)
	reset("GPU reset required", 155, 156, 158)

	reboot("GPU has fallen off the bus", 79)
	reboot("GPU requires a VM or node restart", 151)
	reboot("GPU requires a node power cycle", 160)

	t[54] = XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnNodeReboot, Action: ActionCheckHardware, Description: "auxiliary power is not connected"}
	t[154] = XIDRule{Severity: Healthy, ClearsOn: ClearsOnGPUReset, FollowRecoveryAction: true, Action: ActionInspect, Description: "GPU recovery action changed"}
	return t
}
