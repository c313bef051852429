package simdriver

import (
	"fmt"
	"math"
	"slices"
	"strings"
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
	// hangUntil makes every call on the GPU wait until then; outOfRange and readsLower are the
	// readings whose next read answers a value out of range, or lower than the last.
	hangUntil  time.Time
	outOfRange map[string]bool
	readsLower map[string]bool
}

type linkState struct {
	down bool
	crc  uint64
}

func newNode(sc *sim.Scenario, log func(string, ...any)) *node {
	n := &node{sc: sc, byUUID: map[string]uint32{}, sets: map[setKey]*eventSet{}, sessions: map[uint32]int{},
		unsupported: map[string]bool{}, log: log}
	for i := range sc.GPUCount {
		g := &gpuState{index: i, uuid: sim.GPUUUID(sc.Node, i), busID: fmt.Sprintf("00000000:%02X:00.0", 0x10+i),
			temperature: idleTemperatureC, links: map[uint32]*linkState{}, outOfRange: map[string]bool{}, readsLower: map[string]bool{}}
		n.byUUID[g.uuid] = uint32(i * migSlots)
		for m := 1; m <= sc.MIGInstances[i]; m++ {
			u := sim.MIGUUID(sc.Node, i, m)
			g.migUUIDs = append(g.migUUIDs, u)
			n.byUUID[u] = uint32(i*migSlots + m)
		}
		n.gpus = append(n.gpus, g)
	}
	// Every NVLink a scenario names exists and is up from the start, as the sim backend has it.
	for _, ev := range append(append([]sim.Event{}, sc.Events...), sc.AfterReset...) {
		if ev.Kind == sim.EventNVLink {
			n.gpus[ev.GPU].links[ev.Link] = &linkState{}
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

// errInUse refuses to unload a driver that processes hold, as rmmod refuses a module in use.
type errInUse struct{ pids []uint32 }

func (e errInUse) Error() string {
	return fmt.Sprintf("the driver is in use by %d processes (pids %v): unload refused", len(e.pids), e.pids)
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

// apply changes the GPUs as a scenario event says, and queues the events the driver would
// deliver. An unload that processes hold is refused (errInUse). n.mu must be held.
func (n *node) apply(ev sim.Event) error {
	if ev.Kind == sim.EventDriver {
		switch ev.DriverAction {
		case sim.DriverUnload:
			if pids := n.holders(); len(pids) > 0 {
				return errInUse{pids}
			}
			n.unloaded = true
			n.log("The driver is unloaded: nvmlInit answers DRIVER_NOT_LOADED until it is loaded again")
		case sim.DriverLoad:
			n.unloaded = false
			n.log("The driver is loaded")
		}
		return nil
	}
	if ev.GPU < 0 || ev.GPU >= len(n.gpus) {
		return nil
	}
	g := n.gpus[ev.GPU]
	wire := uint32(ev.GPU * migSlots)
	for range max(ev.Repeat, 1) {
		switch ev.Kind {
		case sim.EventXID:
			e := event{dev: wire, typ: eventXID, data: uint64(ev.XID), gpuInst: noInstance, ciInst: noInstance}
			switch {
			case ev.MIG > 0:
				e.gpuInst, e.ciInst = uint32(ev.MIG), 0
			case ev.GPUInstance != nil:
				e.gpuInst = *ev.GPUInstance
				if ev.ComputeInstance != nil {
					e.ciInst = *ev.ComputeInstance
				}
			}
			n.deliver(e)
		case sim.EventECC:
			if g.lost {
				continue
			}
			g.corrected += ev.CorrectedIncrease
			g.aggCorrected += ev.CorrectedIncrease
			g.uncorrected += ev.UncorrectedIncrease
			g.aggUncorr += ev.UncorrectedIncrease
			if ev.UncorrectedIncrease > 0 {
				n.deliver(event{dev: wire, typ: eventDoubleBitECC, gpuInst: noInstance, ciInst: noInstance})
			}
		case sim.EventRemappedRows:
			if ev.RowsPending != nil {
				g.rowsPending = *ev.RowsPending
				if g.rowsPending {
					g.rowsUncor++
					n.deliver(event{dev: wire, typ: eventDRAMRetirement, gpuInst: noInstance, ciInst: noInstance})
				}
			}
			if ev.RowsFailure != nil {
				g.rowsFailure = *ev.RowsFailure
				if g.rowsFailure {
					n.deliver(event{dev: wire, typ: eventDRAMRetireFailure, gpuInst: noInstance, ciInst: noInstance})
				}
			}
		case sim.EventRetiredPages:
			g.pagesPending = ev.PagesPending
		case sim.EventTemperature:
			g.temperature = ev.TemperatureC
		case sim.EventClockEventReasons:
			g.clockReasons = uint64(ev.ClockEventReasons)
		case sim.EventPCIeReplays:
			g.pcieReplays += uint32(ev.PCIeReplaysIncrease)
		case sim.EventNVLink:
			l := g.links[ev.Link]
			if l == nil {
				l = &linkState{}
				g.links[ev.Link] = l
			}
			if ev.LinkDown != nil {
				l.down = *ev.LinkDown
			} else {
				l.crc += uint64(ev.LinkErrorsIncrease)
			}
		case sim.EventRecoveryAction:
			g.recovery = ev.RecoveryAction
			n.deliver(event{dev: wire, typ: eventRecoveryAction, data: uint64(ev.RecoveryAction), gpuInst: noInstance, ciInst: noInstance})
		case sim.EventLost:
			if !g.lost {
				g.lost = true
				n.deliver(event{dev: wire, typ: eventGPUUnavailable, gpuInst: noInstance, ciInst: noInstance})
			}
		case sim.EventReset:
			n.reset(g)
		case sim.EventHang:
			g.hangUntil = time.Now().Add(ev.Hang)
		case sim.EventOutOfRange:
			g.outOfRange[ev.Reading] = true
		case sim.EventReadsLower:
			g.readsLower[ev.Reading] = true
		}
	}
	return nil
}

// glitch reports, and forgets, a one-read glitch of reading.
func glitch(m map[string]bool, reading string) bool {
	if m[reading] {
		delete(m, reading)
		return true
	}
	return false
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
		*l = linkState{}
	}
	g.recovery = health.RecoveryNone
	g.temperature = idleTemperatureC
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

// lostError is GPU_IS_LOST for calls on a lost GPU (or any of its MIG devices).
func (g *gpuState) lostError(resp *response) bool {
	if g.lost {
		resp.Ret = retGPUIsLost
		return true
	}
	return false
}

// answer serves one call from process pid (every op but HELLO, WAIT and INJECT), and says until
// when the answer must wait (a hanging GPU). n.mu is held.
func (n *node) answer(pid uint32, req *request, resp *response) (hangUntil time.Time) {
	switch req.Op {
	case opInit:
		if n.unloaded {
			resp.Ret = retDriverNotLoaded
			return
		}
		n.sessions[pid]++
		return
	case opShutdown:
		if n.sessions[pid] > 0 {
			n.sessions[pid]--
		}
		return
	case opCount:
		resp.V[0] = uint64(len(n.gpus))
		return
	case opByUUID:
		dev, ok := n.byUUID[req.str()]
		if !ok {
			resp.Ret = retNotFound
			return
		}
		resp.V[0] = uint64(dev)
		return
	case opByPCI:
		for i, g := range n.gpus {
			if samePCI(req.str(), g.busID) {
				resp.V[0] = uint64(i * migSlots)
				return
			}
		}
		resp.Ret = retNotFound
		return
	case opUnsupported:
		if name := req.str(); !n.unsupported[name] {
			n.unsupported[name] = true
			if strings.HasPrefix(name, "nvmlInternalGetExportTable[") {
				n.log("A consumer (nvidia-smi) called an entry of NVML's private export table: answered as an empty success", "entry", name, "pid", pid)
			} else {
				n.log("A consumer called an NVML function the simulator does not implement: answered NOT_SUPPORTED", "function", name, "pid", pid)
			}
		}
		return
	case opReset:
		g, slot, ok := n.gpu(req.Dev)
		if !ok || slot != 0 {
			resp.Ret = retInvalidArgument
			return
		}
		if others := slices.DeleteFunc(n.holders(), func(p uint32) bool { return p == pid }); len(others) > 0 {
			n.log("GPU reset refused: other processes hold the GPUs", "gpu", g.index, "pids", others)
			resp.Ret = retInUse
			return
		}
		if g.lost {
			resp.Ret = retGPUIsLost
			return
		}
		n.reset(g)
		n.log("GPU reset", "gpu", g.index, "by", pid)
		return
	case opEventSetCreate:
		n.nextID++
		n.sets[setKey{pid, n.nextID}] = &eventSet{masks: map[uint32]uint64{}, wake: make(chan struct{}), lostOK: map[uint32]bool{}}
		resp.V[0] = uint64(n.nextID)
		return
	case opEventSetFree:
		k := setKey{pid, req.A}
		s, ok := n.sets[k]
		if !ok {
			resp.Ret = retInvalidArgument
			return
		}
		s.freed = true
		close(s.wake)
		delete(n.sets, k)
		return
	}
	g, slot, ok := n.gpu(req.Dev)
	if !ok {
		resp.Ret = retInvalidArgument
		return
	}
	if g.lostError(resp) {
		return
	}
	n.answerDevice(pid, g, slot, req, resp)
	return g.hangUntil
}

// answerDevice serves a call on one GPU (slot 0) or MIG device (slot 1..).
func (n *node) answerDevice(pid uint32, g *gpuState, slot int, req *request, resp *response) {
	mig := slot > 0
	switch req.Op {
	case opUUID:
		if mig {
			resp.setStr(g.migUUIDs[slot-1])
		} else {
			resp.setStr(g.uuid)
		}
	case opName:
		name := n.sc.Model
		if mig {
			name += " MIG"
		}
		resp.setStr(name)
	case opSerial:
		resp.setStr(fmt.Sprintf("SIM%010d", g.index))
	case opMinor:
		resp.V[0] = uint64(g.index)
	case opPCI:
		resp.V[0], resp.V[1], resp.V[2] = 0, uint64(0x10+g.index), 0
		resp.V[3], resp.V[4] = 0x233010de, 0x16c110de // H100 SXM5 80GB: device 0x2330, vendor 0x10de
	case opMemory:
		resp.V[0], resp.V[1], resp.V[2], resp.V[3] = memoryTotal, memoryTotal-memoryReserved, memoryReserved, memoryReserved
	case opCudaCC:
		resp.V[0], resp.V[1] = 9, 0
	case opBrand:
		resp.V[0] = brandNVIDIA
	case opArch:
		resp.V[0] = archHopper
	case opTemp:
		resp.V[0] = uint64(g.temperature)
		if glitch(g.outOfRange, "temperature") {
			resp.V[0] = math.MaxUint32 // 4,294,967,295 °C
		}
	case opTempThreshold:
		switch req.A {
		case thresholdShutdown:
			resp.V[0] = sim.ShutdownC
		case thresholdSlowdown:
			resp.V[0] = sim.SlowdownC
		default:
			resp.Ret = retNotSupported
		}
	case opECCMode:
		resp.V[0], resp.V[1] = 1, 1
	case opECCTotal:
		if mig {
			resp.Ret = retNotSupported
			return
		}
		var v uint64
		switch {
		case req.A == eccCorrected && req.B == eccVolatile:
			v = g.corrected
		case req.A == eccUncorrected && req.B == eccVolatile:
			v = g.uncorrected
		case req.A == eccCorrected && req.B == eccAggregate:
			v = g.aggCorrected
		case req.A == eccUncorrected && req.B == eccAggregate:
			v = g.aggUncorr
		default:
			resp.Ret = retInvalidArgument
		}
		switch {
		case glitch(g.outOfRange, "ecc"):
			v = math.MaxUint64
		case req.B == eccVolatile && glitch(g.readsLower, "ecc"):
			v = 0
		}
		resp.V[0] = v
	case opRemappedRows:
		if mig {
			resp.Ret = retNotSupported
			return
		}
		resp.V[0], resp.V[1] = uint64(g.rowsCorrected), uint64(g.rowsUncor)
		resp.V[2], resp.V[3] = b2u(g.rowsPending), b2u(g.rowsFailure)
	case opRetiredPending:
		// Hopper remaps rows; NVML answers NOT_SUPPORTED for page retirement.
		resp.Ret = retNotSupported
	case opPower:
		switch {
		case req.A != 0:
			resp.V[0] = powerLimitMW
		case glitch(g.outOfRange, "power"):
			resp.V[0] = math.MaxUint32
		default:
			resp.V[0] = idlePowerMW
		}
	case opClockReasons:
		resp.V[0] = g.clockReasons
	case opPCIeReplays:
		resp.V[0] = uint64(g.pcieReplays)
		switch {
		case glitch(g.outOfRange, "pcieReplays"):
			resp.V[0] = math.MaxUint32
		case glitch(g.readsLower, "pcieReplays"):
			resp.V[0] = 0
		}
	case opNVLinkState:
		l := g.links[req.A]
		if l == nil {
			resp.Ret = retNotSupported
			return
		}
		resp.V[0] = b2u(!l.down)
	case opNVLinkErrors:
		l := g.links[req.A]
		if l == nil {
			resp.Ret = retNotSupported
			return
		}
		if req.B == 2 { // NVML_NVLINK_ERROR_DL_CRC_FLIT
			resp.V[0] = l.crc
		}
	case opField:
		if req.A != fieldRecoveryAction {
			resp.Ret = retNotSupported
			return
		}
		resp.V[0], resp.V[1], resp.V[2] = uint64(g.recovery), valueTypeUint, uint64(time.Now().UnixMicro())
	case opMIGMode:
		resp.V[0] = b2u(len(g.migUUIDs) > 0)
		resp.V[1] = resp.V[0]
	case opMIGMax:
		resp.V[0] = uint64(sim.MaxMIGInstances)
	case opMIGHandle:
		if int(req.A) >= len(g.migUUIDs) {
			resp.Ret = retNotFound
			return
		}
		resp.V[0] = uint64(g.index*migSlots + int(req.A) + 1)
	case opMIGIDs:
		if !mig {
			resp.Ret = retInvalidArgument
			return
		}
		if req.A == 0 {
			resp.V[0] = uint64(slot) // GPU instance n for MIG device n, as the sim backend has it
		}
	case opFabric:
		resp.V[0] = fabricNotSupported
		resp.Ret = retNotSupported
	case opSupportedEvents:
		resp.V[0] = supportedEvents
	case opRegisterEvents:
		s, ok := n.sets[setKey{pid, req.A}]
		if !ok {
			resp.Ret = retInvalidArgument
			return
		}
		if req.C&^supportedEvents != 0 {
			resp.Ret = retNotSupported
			return
		}
		s.masks[req.Dev] |= req.C
		if n.onRegister != nil {
			n.onRegister(pid, g.index, req.C)
		}
	default:
		resp.Ret = retNotSupported
	}
}

// next takes the next event of set (pid, id), or says why there is none now: a lost GPU the set
// watches (GPU_IS_LOST, once per set), or nothing queued (ok false, with the channel to wait on).
func (n *node) next(pid, id uint32, resp *response) (wake <-chan struct{}, done bool) {
	s, ok := n.sets[setKey{pid, id}]
	if !ok {
		resp.Ret = retInvalidArgument
		return nil, true
	}
	if len(s.queue) > 0 {
		e := s.queue[0]
		s.queue = s.queue[1:]
		resp.V[0], resp.V[1], resp.V[2], resp.V[3], resp.V[4] = uint64(e.dev), e.typ, e.data, uint64(e.gpuInst), uint64(e.ciInst)
		return nil, true
	}
	for dev := range s.masks {
		if g, _, ok := n.gpu(dev); ok && g.lost && !s.lostOK[dev] {
			s.lostOK[dev] = true
			resp.Ret = retGPUIsLost
			return nil, true
		}
	}
	return s.wake, false
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

func samePCI(a, b string) bool {
	norm := func(s string) string {
		s = strings.ToLower(strings.TrimSpace(s))
		if dom, rest, ok := strings.Cut(s, ":"); ok && len(dom) < 8 {
			s = strings.Repeat("0", 8-len(dom)) + dom + ":" + rest
		}
		return s
	}
	return norm(a) == norm(b)
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
