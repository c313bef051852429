package health

import "time"

// Severity is how bad a condition, or a device's effective health, is. Values are ordered: a
// larger value is worse.
type Severity uint8

const (
	// Healthy means no action is needed.
	Healthy Severity = iota
	// Degraded means people should know, but schedulers may keep placing work.
	Degraded
	// Unhealthy means no new work should be placed on the device.
	Unhealthy
)

var severityNames = enumNames[Severity]{typ: "Severity", what: "severity", names: []string{Healthy: "Healthy", Degraded: "Degraded", Unhealthy: "Unhealthy"}}

func (s Severity) String() string { return severityNames.String(s) }

// MarshalText implements encoding.TextMarshaler.
func (s Severity) MarshalText() ([]byte, error) { return severityNames.marshal(s) }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Severity) UnmarshalText(b []byte) error { return severityNames.unmarshal(s, b) }

// ParseSeverity parses "Healthy", "Degraded" or "Unhealthy".
func ParseSeverity(s string) (Severity, error) { return severityNames.parse(s) }

// ClearsOn says what ends a condition.
type ClearsOn uint8

const (
	// ClearsOnGPUReset: the condition holds until the GPU is reset (or the node reboots).
	ClearsOnGPUReset ClearsOn = iota
	// ClearsOnNodeReboot: the condition holds until the node reboots.
	ClearsOnNodeReboot
	// ClearsOnRecovered: a polled reading is back in range for the check's hysteresis window.
	ClearsOnRecovered
	// ClearsOnQuietPeriod: no repeat of the signal for the check's quiet period.
	ClearsOnQuietPeriod
	// ClearsOnAdmin: only an administrator clears the condition.
	ClearsOnAdmin
)

var clearsOnNames = enumNames[ClearsOn]{typ: "ClearsOn", what: "clearsOn", names: []string{
	ClearsOnGPUReset:    "gpuReset",
	ClearsOnNodeReboot:  "nodeReboot",
	ClearsOnRecovered:   "recovered",
	ClearsOnQuietPeriod: "quietPeriod",
	ClearsOnAdmin:       "admin",
}}

func (c ClearsOn) String() string { return clearsOnNames.String(c) }

// MarshalText implements encoding.TextMarshaler.
func (c ClearsOn) MarshalText() ([]byte, error) { return clearsOnNames.marshal(c) }

// UnmarshalText implements encoding.TextUnmarshaler.
func (c *ClearsOn) UnmarshalText(b []byte) error { return clearsOnNames.unmarshal(c, b) }

// ParseClearsOn parses one of gpuReset, nodeReboot, recovered, quietPeriod, admin.
func ParseClearsOn(s string) (ClearsOn, error) { return clearsOnNames.parse(s) }

// ClearedByReboot reports whether a node reboot ends a condition that clears on c. A reboot
// resets every GPU and restarts every reading, so only administrative conditions survive it.
func (c ClearsOn) ClearedByReboot() bool { return c != ClearsOnAdmin }

// Action is the remediation NVIDIA's catalog (or the check) recommends for a condition.
type Action string

// Recommended actions. They are advice for people and remediation tools; the library itself only
// acts on severity, clearsOn and evict.
const (
	ActionNone               Action = "none"
	ActionRestartApplication Action = "restartApplication"
	ActionResetGPU           Action = "resetGPU"
	ActionRebootNode         Action = "rebootNode"
	ActionDrainP2P           Action = "drainP2P"
	ActionDrainAndResetGPU   Action = "drainAndResetGPU"
	ActionRecoverIMEXDomain  Action = "recoverIMEXDomain"
	ActionResetBus           Action = "resetBus"
	ActionCheckHardware      Action = "checkHardware"
	ActionCheckCooling       Action = "checkCooling"
	ActionInspect            Action = "inspect"
	// ActionReplaceSoon: the GPU still works, but its spares or margins are nearly spent.
	ActionReplaceSoon Action = "replaceSoon"
)

// NoInstance is the GPU instance or compute instance ID of a signal that concerns the whole
// GPU rather than one MIG instance. It matches NVML's 0xFFFFFFFF.
const NoInstance = ^uint32(0)

// MIGPlacement locates a MIG instance on its parent GPU.
type MIGPlacement struct {
	ParentUUID      string `json:"parentUUID"`
	GPUInstance     uint32 `json:"gpuInstance"`
	ComputeInstance uint32 `json:"computeInstance"`
}

// Device identifies a GPU or a MIG instance. UUID is the identity; the other fields are
// attributes, and Index in particular may change when a card disappears.
type Device struct {
	UUID     string `json:"uuid"`
	Index    int    `json:"index"`
	PCIBusID string `json:"pciBusID,omitempty"`
	Minor    int    `json:"minor"`
	Model    string `json:"model,omitempty"`
	// Serial is the board's serial number (NVML's nvmlDeviceGetSerial): what names a physical
	// GPU wherever it is plugged in, where UUID and PCIBusID name it on one node. Empty when the
	// GPU or its driver has none (NVML answers NOT_SUPPORTED on GeForce boards) and on MIG
	// instances. An attribute like the others: devices are matched by UUID, never by serial.
	Serial string `json:"serial,omitempty"`
	// VBIOS is the version of the board's video BIOS (NVML's nvmlDeviceGetVbiosVersion, such as
	// "96.00.89.00.01"): the firmware a batch of boards shares, so a bad one is a cause GPUs on
	// many nodes have in common. Empty when unknown and on MIG instances. An attribute like the
	// others.
	VBIOS string `json:"vbios,omitempty"`
	// MIG is set for a MIG instance and nil for a whole GPU.
	MIG *MIGPlacement `json:"mig,omitempty"`
	// Missing marks a placeholder for a GPU the node should have but the backend cannot open
	// (see MissingGPUs): its UUID is made up, Index is -1, and it is Unhealthy (GPUMissing).
	Missing bool `json:"missing,omitempty"`
}

// ConditionType names a family of conditions. Within one device a condition is identified by
// its type and its Code.
type ConditionType string

// Condition types produced by the built-in checks.
const (
	ConditionXID                  ConditionType = "XID"
	ConditionGPULost              ConditionType = "GPULost"
	ConditionGPUResetRequired     ConditionType = "GPUResetRequired"
	ConditionECCUncorrected       ConditionType = "ECCUncorrected"
	ConditionECCCorrectedStorm    ConditionType = "ECCCorrectedStorm"
	ConditionRowRemapFailure      ConditionType = "RowRemapFailure"
	ConditionRowRemapPending      ConditionType = "RowRemapPending"
	ConditionRetiredPagesPending  ConditionType = "RetiredPagesPending"
	ConditionThermal              ConditionType = "Thermal"
	ConditionClockThrottle        ConditionType = "ClockThrottle"
	ConditionPCIeReplayRate       ConditionType = "PCIeReplayRate"
	ConditionNVLinkDown           ConditionType = "NVLinkDown"
	ConditionNVLinkErrorRate      ConditionType = "NVLinkErrorRate"
	ConditionRecoveryAction       ConditionType = "RecoveryAction"
	ConditionAdmin                ConditionType = "Admin"
	ConditionFabricRegistration   ConditionType = "FabricRegistration"
	ConditionFabricHealth         ConditionType = "FabricHealth"
	ConditionRowRemapAvailability ConditionType = "RowRemapAvailability"
	ConditionSRAMThreshold        ConditionType = "SRAMThreshold"
	ConditionPCIeLinkDegraded     ConditionType = "PCIeLinkDegraded"
	ConditionNVLinkRecoveries     ConditionType = "NVLinkRecoveries"
)

// Condition is one reason a device is not fully healthy.
type Condition struct {
	Type ConditionType `json:"type"`
	// Code tells conditions of one type apart: the XID for XID conditions, the link for NVLink
	// ones, zero otherwise.
	Code              uint32    `json:"code,omitempty"`
	Severity          Severity  `json:"severity"`
	Reason            string    `json:"reason"`
	Message           string    `json:"message"`
	Since             time.Time `json:"since"`
	LastSeen          time.Time `json:"lastSeen"`
	ClearsOn          ClearsOn  `json:"clearsOn"`
	RecommendedAction Action    `json:"recommendedAction"`
	// Evict asks for running work on the device to be evicted, not just for new work to stay away.
	Evict bool `json:"evict,omitempty"`
	// CausedByPrevious marks an XID condition the driver said an earlier XID caused ("caused by
	// previous Xid 149"): it is never taken for another GPU's root cause, on this node or on a
	// peer's (PeerFault).
	CausedByPrevious bool `json:"causedByPrevious,omitempty"`
}

// XIDCount records how often an XID was seen on a device, including XIDs that do not change
// health (application errors), so that they stay visible.
type XIDCount struct {
	XID      uint32    `json:"xid"`
	Count    uint64    `json:"count"`
	LastSeen time.Time `json:"lastSeen"`
}

// DeviceStatus is the health of one device at a point in time.
type DeviceStatus struct {
	Device Device `json:"device"`
	// Health is the worst severity among the device's own conditions and, for a MIG instance,
	// its parent's.
	Health Severity `json:"health"`
	// Evict is true when any condition in effect asks for eviction.
	Evict bool `json:"evict"`
	// Conditions in effect, the device's own first, then those inherited from the parent GPU.
	Conditions []Condition `json:"conditions"`
	XIDs       []XIDCount  `json:"xids,omitempty"`
	// Unmonitored is set when the backend cannot watch the device (events not supported).
	Unmonitored bool `json:"unmonitored,omitempty"`
	// UnmonitoredChecks names the checks the backend cannot run on the device (ECC disabled,
	// a function the driver lacks), sorted; see Tracker.SetCheckUnmonitored. Like Unmonitored,
	// it is no data, never a fault.
	UnmonitoredChecks []Check `json:"unmonitoredChecks,omitempty"`
	// History is a physical GPU's faults and repairs, oldest first (see HistoryEntry).
	History []HistoryEntry `json:"history,omitempty"`
}

// Snapshot is the health of every tracked device. Devices are ordered by index, each GPU
// followed by its MIG instances.
type Snapshot struct {
	Time    time.Time      `json:"time"`
	BootID  string         `json:"bootID,omitempty"`
	Devices []DeviceStatus `json:"devices"`
	// Findings are facts about the node as a whole that change no GPU's health, such as an XID
	// spread over several GPUs (a likely software cause).
	Findings []NodeFinding `json:"findings,omitempty"`
}

// UnhealthyGPUs returns the physical GPUs of the snapshot that are Unhealthy, in its order: what
// a consumer that takes whole cards out of service (a device plugin's list, HAMi's cordon) takes
// out. MIG instances are left out, as a card's own faults reach it and an instance's need not;
// so are the placeholders of missing GPUs, which no consumer ever registered.
func (s Snapshot) UnhealthyGPUs() []DeviceStatus {
	var out []DeviceStatus
	for _, d := range s.Devices {
		if d.Device.MIG == nil && !d.Device.Missing && d.Health == Unhealthy {
			out = append(out, d)
		}
	}
	return out
}

// Transition records a change of a device's effective health.
type Transition struct {
	Time   time.Time `json:"time"`
	Device Device    `json:"device"`
	From   Severity  `json:"from"`
	To     Severity  `json:"to"`
	// Reason is the reason of the worst condition after the change, or, when the device became
	// healthier, why the last condition cleared.
	Reason string `json:"reason"`
	// Message is the message of the worst condition after the change; empty when the device is
	// healthy.
	Message string `json:"message,omitempty"`
}
