package simdriver

import (
	"slices"
	"strings"
	"time"

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

// answerDevice serves a call on one GPU (slot 0) or MIG device (slot 1..), by op group
// (answer_device.go).
func (n *node) answerDevice(pid uint32, g *gpuState, slot int, req *request, resp *response) {
	mig := slot > 0
	switch req.Op {
	case opUUID, opName, opSerial, opVBIOS, opMinor, opPCI, opMemory, opCudaCC, opBrand, opArch:
		n.answerIdentity(g, slot, req, resp)
	case opTemp, opTempThreshold, opPower, opClockReasons:
		g.answerSensors(req, resp)
	case opECCMode, opECCTotal, opRemappedRows, opRetiredPending, opRowRemapHistogram, opSRAMStatus:
		g.answerMemory(mig, req, resp)
	case opPCIeReplays, opPCIeLink:
		g.answerPCIe(req, resp)
	case opNVLinkState, opNVLinkErrors, opField:
		g.answerNVLink(req, resp)
	case opFabric:
		g.answerFabric(resp)
	case opMIGMode, opMIGMax, opMIGHandle, opMIGIDs:
		g.answerMIG(slot, req, resp)
	case opSupportedEvents, opRegisterEvents:
		n.answerEvents(pid, g, req, resp)
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

// samePCI compares PCI addresses as health.NormalizePCIBusID writes them (NVML's eight-digit
// domain, sysfs's four); what is no address is compared as written.
func samePCI(a, b string) bool {
	na, errA := health.NormalizePCIBusID(a)
	nb, errB := health.NormalizePCIBusID(b)
	if errA != nil || errB != nil {
		return strings.EqualFold(strings.TrimSpace(a), strings.TrimSpace(b))
	}
	return na == nb
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
