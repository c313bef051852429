// Command xiddoc writes docs/xid-policy.md from the built-in policies, so the document cannot
// drift from the code: `go run ./hack/xiddoc > docs/xid-policy.md`; `make verify` checks it.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func main() {
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	def, dp := health.DefaultPolicy(), health.DevicePluginPolicy()
	fmt.Fprint(w, header)
	fmt.Fprintln(w, "## The XID table (profile `default`)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| XID | meaning | severity | clears on | evict | recommended action |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, x := range def.SortedXIDs() {
		r := def.XIDs[x]
		sev := r.Severity.String()
		clears := r.ClearsOn.String()
		switch {
		case r.FollowRecoveryAction:
			sev, clears = "follows NVML's recovery action", "—"
		case r.Severity == health.Healthy:
			sev, clears = "Healthy (counted, visible)", "—"
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s |\n", x, r.Description, sev, clears, yesNo(r.Evict), r.Action)
	}
	u := def.UnknownXID
	fmt.Fprintf(w, "| any other | %s | %s | %s | %s | %s |\n", u.Description, u.Severity, u.ClearsOn, yesNo(u.Evict), u.Action)
	l := def.Lost
	fmt.Fprintf(w, "| (GPU lost) | %s | %s | %s | %s | %s |\n", l.Description, l.Severity, l.ClearsOn, yesNo(l.Evict), l.Action)
	fmt.Fprintln(w)
	fmt.Fprint(w, checks)
	fmt.Fprintf(w, "| temperature | ≥ slowdown threshold (device's own, else %d °C) | Degraded | recovered (%d clean samples) |\n", health.DefaultSlowdownC, def.Thermal.RecoverySamples)
	fmt.Fprintf(w, "| temperature | ≥ shutdown threshold (device's own, else %d °C) | Unhealthy | recovered (%d clean samples) |\n", health.DefaultShutdownC, def.Thermal.RecoverySamples)
	fmt.Fprintf(w, "| clock events | %s active | Degraded | recovered (%d clean samples) |\n", def.ClockEvents.Reasons, def.ClockEvents.RecoverySamples)
	fmt.Fprintf(w, "| PCIe replays | rate > %.0f/min | Degraded | recovered (%d clean samples) |\n", def.PCIeReplays.PerMinute, def.PCIeReplays.RecoverySamples)
	fmt.Fprintf(w, "| NVLink errors | rate > %.0f/min on a link | Degraded | recovered (%d clean samples) |\n", def.NVLink.ErrorsPerMinute, def.NVLink.RecoverySamples)
	fmt.Fprintf(w, "| NVLink state | a link is down | Unhealthy | recovered (%d clean samples) |\n", def.NVLink.RecoverySamples)
	fmt.Fprintf(w, "| ECC | uncorrected volatile count > 0 | Unhealthy | gpuReset |\n")
	fmt.Fprintf(w, "| ECC | corrected volatile rate > %.0f/min, or NVML's single-bit storm event | Degraded | quietPeriod (%v) |\n", def.ECC.CorrectedStormPerMinute, def.QuietPeriod)
	fmt.Fprintf(w, "| row remapper | remap failure | Unhealthy | recovered (%d clean samples) |\n", health.DefaultRecoverySamples)
	fmt.Fprintf(w, "| row remapper | remap pending | Degraded | gpuReset |\n")
	fmt.Fprintf(w, "| retired pages | retirement pending | Degraded | gpuReset |\n")
	fmt.Fprintf(w, "| recovery action | GPU_RESET, DRAIN_AND_RESET, BUS_RESET | Unhealthy | gpuReset (or NONE) |\n")
	fmt.Fprintf(w, "| recovery action | NODE_REBOOT, SYSTEM_REBOOT, RECOVER_IMEX_DOMAIN | Unhealthy | nodeReboot (or NONE) |\n")
	fmt.Fprintf(w, "| recovery action | DRAIN_P2P | Degraded | NONE |\n")
	fmt.Fprintf(w, "| recovery action | any other value N (reason RecoveryActionUnknownN) | Unhealthy | nodeReboot (or NONE) |\n")
	fmt.Fprintf(w, "| reset required | an NVML call answers ERROR_RESET_REQUIRED | Unhealthy | gpuReset |\n")
	fmt.Fprintf(w, "| NVLink fabric | registration completed with a failed status (FabricRegistrationFailed) | Unhealthy | recovered |\n")
	fmt.Fprintf(w, "| NVLink fabric | registration not completed %v after the first reading (FabricRegistrationPending) | Degraded | recovered |\n", def.Fabric.RegistrationTimeout)
	fmt.Fprintf(w, "| NVLink fabric | health mask: route unhealthy, or bandwidth degraded | Degraded | recovered |\n")
	fmt.Fprintf(w, "| row remapper histogram | banks with no (RowRemapAvailabilityNone) or few (…Low) spare rows; replaceSoon | Degraded | recovered |\n")
	fmt.Fprintf(w, "| SRAM ECC | the driver's error threshold exceeded (SRAMECCThresholdExceeded); replaceSoon | Degraded | recovered |\n")
	fmt.Fprintf(w, "| PCIe link | trained narrower than its maximum width (generation too, when configured) | Degraded | recovered (%d clean samples) |\n", def.PCIeLink.RecoverySamples)
	fmt.Fprintf(w, "| NVLink recoveries | a link's lifetime recovery count rises by %.0f or more within an hour | Degraded | recovered |\n", def.NVLinkRecoveries.PerHour)
	fmt.Fprintln(w)
	writeRepeats(w, def)
	fmt.Fprintln(w, "## Profile `device-plugin`")
	fmt.Fprintln(w)
	var ignored []string
	for _, x := range dp.SortedXIDs() {
		if dp.XIDs[x].Severity == health.Healthy {
			ignored = append(ignored, fmt.Sprint(x))
		}
	}
	fmt.Fprintf(w, "Reproduces the NVIDIA device plugin: XIDs %s are ignored (counted, visible); every other XID,\n", strings.Join(ignored, ", "))
	fmt.Fprintf(w, "and a lost GPU, make the GPU %s until an administrator clears it (clears on `%s`); no polled\n", dp.UnknownXID.Severity, dp.UnknownXID.ClearsOn)
	fmt.Fprintln(w, "check runs. The one difference: with a checkpoint configured, the fault also survives a restart")
	fmt.Fprintln(w, "of the process, where the plugin forgets it. Embedders who want the plugin's forgetfulness run")
	fmt.Fprintln(w, "without a checkpoint.")
}

// writeRepeats writes the repeat rules, the driver's XID qualifiers and escalation.
func writeRepeats(w *bufio.Writer, p *health.Policy) {
	fmt.Fprint(w, repeats)
	fmt.Fprintln(w, "| rule (reason) | XIDs | fires when | within | bursts | raises | source |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, r := range p.Repeats {
		when, raises := fmt.Sprintf("%d on one GPU", r.Count), fmt.Sprintf("%s, clears on %s, %s", r.Severity, r.ClearsOn, r.Action)
		if r.NodeScoped() {
			when, raises = fmt.Sprintf("on %d GPUs of the node", r.GPUs), "a node finding (no GPU made less healthy)"
		}
		fmt.Fprintf(w, "| `%s` | %s | %s | %v | %v apart | %s | %s |\n", r.Name, r.XIDList(), when, r.Window, r.Burst, raises, r.Source)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, qualifiers, p.RootCauseWindow, p.RootCauseWindow)
	e := p.Escalation
	fmt.Fprintf(w, escalation, e.Window, e.Returns, health.MaxHistory, gpuhealthv1.MaxRecentHistory)
	fmt.Fprint(w, missing)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

const header = `# XID and check policy

<!-- Generated by ` + "`go run ./hack/xiddoc > docs/xid-policy.md`" + `; edit hack/xiddoc or pkg/health, not this file. -->

gpuhealth turns raw GPU signals into conditions. Each condition has a **severity** (` + "`Healthy`" + `:
nothing to do; ` + "`Degraded`" + `: tell people, keep scheduling; ` + "`Unhealthy`" + `: stop new work), may ask for
**eviction** of running work, names a **recommended action**, and says what **clears** it:

| clears on | meaning |
|---|---|
| ` + "`gpuReset`" + ` | the GPU is reset (or the node reboots) |
| ` + "`nodeReboot`" + ` | the node reboots (a new boot ID) |
| ` + "`recovered`" + ` | a polled reading is back in range for N consecutive samples (hysteresis) |
| ` + "`quietPeriod`" + ` | the signal has not repeated for the quiet period |
| ` + "`admin`" + ` | only an administrator clears it |

A device's health is the worst severity of its conditions; a MIG instance also inherits its
parent GPU's conditions. Every table below is data (` + "`health.Policy`" + `); a HealthConfig file
changes any of it (see [configuration.md](configuration.md)).

The XID table follows the recommended actions of NVIDIA's XID catalog. Application errors do not
make a GPU unhealthy (the application restarts), but they are counted per GPU and shown. XIDs the
table does not know are treated as Unhealthy until a GPU reset: failing safe beats placing work on
a GPU nobody understands. XID 154 carries no verdict of its own: the backend reads NVML's GPU
recovery action when it sees it, and the recovery-action check decides.

`

const checks = `## Polled checks (profile ` + "`default`" + `)

Counters (ECC, PCIe replays, NVLink errors) are sampled as totals and turned into rates by the
library; a counter that goes backwards (a reset) starts a new baseline. A worse reading takes
effect at once; a better one only after the check's recovery samples (several readings at one
instant count once).

| check | when | severity | clears on |
|---|---|---|---|
`

const repeats = `## Repeat rules (profile ` + "`default`" + `)

Some XIDs mean little once and much when they come back. A repeat rule counts an XID (or a set
of XIDs) on the physical GPU (a MIG instance's XID counts for its GPU); occurrences closer than
the rule's burst to the last one counted are the same event, so one crash logged ten times, or a
flood of thousands, counts once. A same-GPU rule raises a condition of its own (type ` + "`XIDRepeat`" + `,
reason the rule's name) when its count falls within the window: the card, not the job, is the
likely cause. A spread rule fires when the XIDs show up on several GPUs of the node within the
window: the software (driver, CUDA image, a job that fails everywhere) is the likely cause, so it
raises a node finding, shown on the ` + "`GPUUnhealthy`" + ` node condition and by ` + "`simulate`" + `, and makes no
GPU less healthy; it ends once the window passes without enough GPUs. An XID the driver says an
earlier one caused counts towards no rule: it is the echo of a fault already judged.

`

const qualifiers = `## What the driver says beside the XID

NVLink5 XIDs (144-150) name a unit, a severity and a link; XID 74 a fatal link; XID 45 the earlier
XID that caused it (see [kernel-log.md](kernel-log.md)). A **Nonfatal** XID is Degraded at most
and never evicts, whatever its rule, and never lowers a condition already in effect. An XID the
driver says **an earlier XID caused** is attributed to the GPU of the node with an Unhealthy XID
of its own seen within the last %v (the GPU with the XID the driver named first): that root GPU
keeps its fault, and this one is Degraded with reason ` + "`XID<n>CausedByGPU<root index>`" + ` and action
` + "`inspect`" + `. With no such GPU the XID keeps its rule: failing safe beats blaming a GPU nobody saw fail.

Across nodes: a GB200 NVL72 rack is one NVLink domain of 18 nodes, and one GPU's NVLink error
reaches GPUs of other nodes. The agent of a node labelled with its domain (` + "`nvidia.com/gpu.clique`" + `,
which GPU feature discovery sets; ` + "`agent.nvlinkDomainLabel`" + `) reads the faults the agents of the
other nodes of the domain report (the gpu-health annotation's ` + "`xidFaults`" + `), and attributes a
caused-by XID to a peer's fault of the XID the driver named, on a GPU the peer's own report marks
Unhealthy, that began within %v of it either way (the peer's report comes late, and clocks
differ) when no GPU of its own node had one: reason ` + "`XID<n>CausedByPeerGPU`" + `, the peer's node
and GPU in the message and the Event. An XID that names no cause is never a peer's. An XID raised
before the peer's report arrived is attributed when it does; the attribution ends when the
peer's report no longer has the fault, and the XID is its GPU's own again, under its rule.

`

const escalation = `## Memory: faults that come back after repairs

Each physical GPU keeps a history of its faults (it became Unhealthy through a condition that
needs a repair, so neither a drain nor a polled reading that recovers on its own) and its
repairs (GPU resets, and reboots that found a fault pending). The history is in the checkpoint,
so it survives restarts and reboots, and the gpu-health annotation sums it up (` + "`gpuhealth status -o wide`" + `
and ` + "`-o json`" + `). When a GPU's fault has come back within %v of a repair %d times since an
administrator last cleared it, the GPU gets condition ` + "`ReplaceGPU`" + ` (reason
` + "`FaultReturnsAfterRepair`" + `, Unhealthy, action ` + "`replaceGPU`" + `, clears on ` + "`admin`" + `): remediation
never resets it again. gpud escalates the same way after two reboots (its ` + "`DefaultRebootThreshold`" + `).
Clearing the GPU (` + "`gpuhealth clear`" + `) starts its count again. The history keeps the newest %d
entries; the annotation counts them and carries the newest %d (it is on every Node update every
scheduler receives: 32 entries on each of 8 GPUs made the Node's writes take twice as long).

`

const missing = `## Missing GPUs

A node can lose a GPU without any XID: it fails to initialise, falls off the bus before the
driver loads, or NVIDIA's driver fails to bind it, and NVML simply returns one GPU fewer. The agent
compares the NVIDIA GPUs on the PCI bus (vendor 0x10de, display and 3D controller classes, read
from sysfs) and, when configured, an expected count with the GPUs the backend opens. Each
missing one becomes a placeholder, ` + "`MISSING-<PCI address>`" + ` (or ` + "`MISSING-<n>`" + ` past what the
bus shows), Unhealthy with reason ` + "`GPUMissing`" + ` and action ` + "`checkHardware`" + `, on the gpu-health
annotation (` + "`missing: true`" + `, index -1) and in ` + "`gpuhealth status`" + `; the node carries the finding
` + "`GPUsMissing`" + ` ("the node runs 3 of its 4 GPUs") on its ` + "`GPUUnhealthy`" + ` condition. Kernel-log lines
that name its address are kept against it. Volcano's index list, HAMi's cordon, DRA and the
extender leave it out: none of them ever offered it. The comparison is made anew at every start,
so ` + "`GPUMissing`" + ` is never checkpointed and a GPU that is back is not held missing. A GPU bound
to another driver on purpose (` + "`vfio-pci`" + `: KubeVirt, Kata passthrough) is left out, neither
watched nor missing, and told once per start in a ` + "`GPUBoundToOtherDriver`" + ` Event on the Node;
` + "`inventory.otherDrivers: missing`" + ` counts it missing ([configuration.md](configuration.md)).
Placeholders stop once the node has 1,024 GPUs: a bus that lists more holds fakes.

`
