package simdriver

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// How the simulator answers each call of the library: the node's state (node.go) as NVML
// would report it.

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
		resp.setStr(sim.Serial(g.index)) // what the simulated dcgmi lists too
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
		switch req.A {
		case fieldRecoveryAction:
			resp.V[0], resp.V[1] = uint64(g.recovery), valueTypeUint
		case fieldNVLinkRecoverySuccessful, fieldNVLinkRecoveryFailed:
			// The link is the field's scope (B).
			l := g.links[req.B]
			if l == nil {
				resp.Ret = retNotSupported
				return
			}
			resp.V[0], resp.V[1] = l.recovered, valueTypeULongLong
			if req.A == fieldNVLinkRecoveryFailed {
				resp.V[0] = l.failed
			}
		default:
			resp.Ret = retNotSupported
			return
		}
		resp.V[2] = uint64(time.Now().UnixMicro())
	case opRowRemapHistogram:
		if mig {
			resp.Ret = retNotSupported // as GetRemappedRows: no row remapper readings in MIG mode
			return
		}
		none := uint64(g.banksNone)
		if glitch(g.outOfRange, "rowRemapHistogram") {
			none = math.MaxUint32
		}
		resp.V[0] = uint64(sim.RemapBanks - g.banksLow - g.banksNone) // every other bank has all its spare rows
		resp.V[3], resp.V[4] = uint64(g.banksLow), none
	case opSRAMStatus:
		resp.V[3] = b2u(g.sramExceeded)
	case opPCIeLink:
		switch req.A {
		case pcieCurrGen:
			resp.V[0] = uint64(g.pcie.Gen)
		case pcieCurrWidth:
			resp.V[0] = uint64(g.pcie.Width)
			if glitch(g.outOfRange, "pcieLink") {
				resp.V[0] = pcieLinkGlitch
			}
		case pcieMaxGen:
			resp.V[0] = uint64(g.pcie.MaxGen)
		case pcieMaxWidth:
			resp.V[0] = uint64(g.pcie.MaxWidth)
		case pcieGPUMaxGen:
			resp.V[0] = sim.PCIeGen // the GPU's own, whatever the slot
		default:
			resp.Ret = retInvalidArgument
		}
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
		if g.fabric == fabricNotSupported {
			resp.Ret = retNotSupported
			return
		}
		// The clique and the cluster UUID are what Fabric Manager reports for a registered GPU;
		// the state, the status and the health mask are the scenario's.
		resp.V[0], resp.V[1], resp.V[2] = g.fabric, uint64(g.fabricStatus), 1
		resp.V[3], resp.V[4] = fabricMask(g.fabricHealth)
		resp.setStr("gpuhealth-sim-cl") // NVML_GPU_FABRIC_UUID_LEN (16) bytes
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

// fabricMask encodes a fabric's health flags as nvml.h's health mask (every field TRUE or FALSE,
// as a driver that reports them all) and its summary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*: 1
// healthy, 2 unhealthy, 3 limited capacity).
func fabricMask(f health.FabricReading) (mask, summary uint64) {
	for _, field := range [...]struct {
		set   bool
		shift uint
	}{
		{f.DegradedBandwidth, fabricShiftDegradedBW}, {f.RouteRecovery, fabricShiftRouteRecovery},
		{f.RouteUnhealthy, fabricShiftRouteUnhealthy}, {f.AccessTimeoutRecovery, fabricShiftAccessTimeoutRecov},
	} {
		v := uint64(fabricHealthFalse)
		if field.set {
			v = fabricHealthTrue
		}
		mask |= v << field.shift
	}
	switch {
	case f.RouteUnhealthy:
		return mask, 2
	case f.DegradedBandwidth:
		return mask, 3
	}
	return mask, 1
}

// glitch reports, and forgets, a one-read glitch of reading.
func glitch(m map[string]bool, reading string) bool {
	if m[reading] {
		delete(m, reading)
		return true
	}
	return false
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
