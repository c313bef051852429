package simdriver

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Idle readings of a simulated GPU, as the sim backend has them.
const (
	idleTemperatureC = sim.IdleTemperatureC
	idlePowerMW      = 72_000
	powerLimitMW     = 700_000
	memoryTotal      = 80 << 30
	memoryReserved   = 512 << 20
	maxEventsQueued  = 4096
)

// node is the state of every simulated GPU of one node and the event sets of every process
// that watches them: the one truth all consumers of the driver root see.
type node struct {
	mu   sync.Mutex
	sc   *sim.Scenario
	gpus []*gpuState
	// byUUID maps a GPU's or MIG device's UUID to its wire number.
	byUUID map[string]uint32
	// sets are the event sets by owner process and ID.
	sets   map[setKey]*eventSet
	nextID uint32
	// sessions counts each process's NVML sessions (nvmlInit without nvmlShutdown): a reset is
	// refused while a process other than the resetting one holds the GPUs.
	sessions map[uint32]int
	// unsupported are the functions consumers called that the simulator does not implement,
	// each logged once.
	unsupported map[string]bool
	// unloaded is set while the driver is unloaded: nvmlInit answers DRIVER_NOT_LOADED.
	unloaded   bool
	log        func(msg string, kv ...any)
	onRegister func(pid uint32, gpu int, types uint64)
}

type setKey struct{ pid, id uint32 }

type eventSet struct {
	// masks are the registered event types per wire device.
	masks  map[uint32]uint64
	queue  []event
	wake   chan struct{} // closed and replaced when an event is queued or the set is freed
	freed  bool
	lostOK map[uint32]bool // lost devices whose GPU_IS_LOST this set has been told
}

type event struct {
	dev             uint32 // wire number of the GPU (MIG events name the parent, with the IDs)
	typ, data       uint64
	gpuInst, ciInst uint32
}

type gpuState struct {
	index                    int
	uuid, busID              string
	serial                   string // the board's: the scenario's (sim.Scenario.Serial)
	migUUIDs                 []string
	temperature              int64
	corrected, uncorrected   uint64 // volatile
	aggCorrected, aggUncorr  uint64
	rowsCorrected, rowsUncor uint32
	rowsPending, rowsFailure bool
	pagesPending             bool
	clockReasons             uint64
	pcieReplays              uint32
	links                    map[uint32]*linkState
	recovery                 health.RecoveryAction
	lost                     bool
	// fabric is the GPU's NVLink fabric state (NVML_GPU_FABRIC_STATE_*): NOT_SUPPORTED for a
	// GPU outside an NVLink fabric. fabricStatus is the registration's nvmlReturn_t and
	// fabricHealth its health flags.
	fabric       uint64
	fabricStatus uint32
	fabricHealth health.FabricReading
	// The early warnings: the row remapper's banks with few and no spare rows left, the SRAM ECC
	// threshold, the PCIe link.
	banksLow, banksNone uint32
	sramExceeded        bool
	pcie                health.PCIeLinkReading
	// hangUntil makes every call on the GPU wait until then; outOfRange and readsLower are the
	// readings whose next read answers a value out of range, or lower than the last.
	hangUntil  time.Time
	outOfRange map[string]bool
	readsLower map[string]bool
	// diag is how a DCGM diagnostic of the GPU answers (the scenario's diag and latent events):
	// only the simulated dcgmi reads it, no NVML call.
	diag sim.DiagState
}

type linkState struct {
	down bool
	crc  uint64
	// recovered and failed are the link's lifetime recovery counts: a reset does not clear them.
	recovered, failed uint64
}

func newNode(sc *sim.Scenario, log func(string, ...any)) *node {
	n := &node{sc: sc, byUUID: map[string]uint32{}, sets: map[setKey]*eventSet{}, sessions: map[uint32]int{},
		unsupported: map[string]bool{}, log: log}
	for i := range sc.GPUCount {
		g := &gpuState{index: i, uuid: sim.GPUUUID(sc.Node, i), busID: sim.PCIBusID(i), serial: sc.Serial(i),
			temperature: idleTemperatureC, links: map[uint32]*linkState{}, outOfRange: map[string]bool{}, readsLower: map[string]bool{},
			pcie: health.PCIeLinkReading{Gen: sim.PCIeGen, MaxGen: sim.PCIeGen, Width: sim.PCIeWidth, MaxWidth: sim.PCIeWidth}}
		n.byUUID[g.uuid] = uint32(i * migSlots)
		for m := 1; m <= sc.MIGInstances[i]; m++ {
			u := sim.MIGUUID(sc.Node, i, m)
			g.migUUIDs = append(g.migUUIDs, u)
			n.byUUID[u] = uint32(i*migSlots + m)
		}
		n.gpus = append(n.gpus, g)
	}
	// A GPU the scenario names an NVLink of is an SXM GPU: all its sim.MaxNVLinks links exist
	// and are up from the start (the sim backend samples only the links the scenario names;
	// the others never change, so health is the same). Other GPUs have no NVLink.
	for _, ev := range append(append([]sim.Event{}, sc.Events...), sc.AfterReset...) {
		if (ev.Kind == sim.EventNVLink || ev.Kind == sim.EventNVLinkRecoveries) && len(n.gpus[ev.GPU].links) == 0 {
			for l := range uint32(sim.MaxNVLinks) {
				n.gpus[ev.GPU].links[l] = &linkState{}
			}
		}
	}
	// An SXM GPU sits in an NVSwitch system, whose Fabric Manager has registered it (COMPLETED)
	// unless the scenario says otherwise; so does a GPU the scenario gives a fabric state.
	for _, ev := range append(append([]sim.Event{}, sc.Events...), sc.AfterReset...) {
		if ev.Kind == sim.EventNVLink || ev.Kind == sim.EventNVLinkRecoveries || ev.Kind == sim.EventFabric {
			n.gpus[ev.GPU].fabric = fabricCompleted
		}
	}
	return n
}

// gpu returns the GPU of a wire device and the MIG slot (0 for the GPU itself).
func (n *node) gpu(dev uint32) (*gpuState, int, bool) {
	i, slot := int(dev/migSlots), int(dev%migSlots)
	if i >= len(n.gpus) || slot > len(n.gpus[i].migUUIDs) {
		return nil, 0, false
	}
	return n.gpus[i], slot, true
}

// errInUse refuses to unload a driver, or to reset a GPU, that processes hold: rmmod refuses a
// module in use, and `nvidia-smi --gpu-reset` a GPU another process has open.
type errInUse struct {
	what string // "unload" or "reset"
	pids []uint32
}

func (e errInUse) Error() string {
	return fmt.Sprintf("the driver is in use by %d processes (pids %v): %s refused", len(e.pids), e.pids, e.what)
}

// holders lists the processes with an NVML session open. n.mu must be held.
func (n *node) holders() []uint32 {
	var pids []uint32
	for pid, s := range n.sessions {
		if s > 0 {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// deliver queues e on every event set that registered its type for its device, after the
// registration (events are never replayed to a set registered later).
func (n *node) deliver(e event) {
	for _, s := range n.sets {
		if s.masks[e.dev]&e.typ == 0 {
			continue
		}
		if len(s.queue) >= maxEventsQueued {
			s.queue = s.queue[1:] // the driver's queue is bounded too; the oldest event goes
		}
		s.queue = append(s.queue, e)
		close(s.wake)
		s.wake = make(chan struct{})
	}
}

// closeProcess frees what a process that is gone left: its event sets and sessions.
func (n *node) closeProcess(pid uint32) {
	for k, s := range n.sets {
		if k.pid == pid {
			s.freed = true
			close(s.wake)
			delete(n.sets, k)
		}
	}
	delete(n.sessions, pid)
}

// reset does what `nvidia-smi --gpu-reset` does to a simulated GPU: volatile counters cleared,
// pending remaps and retirements applied, NVLinks retrained, the recovery action satisfied. A
// lost GPU does not come back and a remapper failure is permanent.
func (n *node) reset(g *gpuState) {
	if g.lost {
		return
	}
	g.corrected, g.uncorrected = 0, 0
	g.rowsPending, g.pagesPending = false, false
	g.pcieReplays = 0
	for _, l := range g.links {
		l.down, l.crc = false, 0 // the recovery counts are the link's lifetime's
	}
	g.recovery = health.RecoveryNone
	g.temperature = idleTemperatureC
}

// setMIG gives GPU index count MIG instances (0: MIG mode off), named as the sim backend names
// them: instances that stay keep their UUIDs. n.mu must be held.
func (n *node) setMIG(g *gpuState, index, count int) {
	for _, u := range g.migUUIDs {
		delete(n.byUUID, u)
	}
	g.migUUIDs = nil
	for m := 1; m <= count; m++ {
		u := sim.MIGUUID(n.sc.Node, index, m)
		g.migUUIDs = append(g.migUUIDs, u)
		n.byUUID[u] = uint32(index*migSlots + m)
	}
	n.log("The MIG layout changed", "gpu", index, "instances", count)
}
