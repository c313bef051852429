package simdriver

import (
	"math"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// The calls on one GPU or MIG device, by op group (answerDevice dispatches): what NVML would
// report of the GPU's state (node.go).

// answerIdentity serves what the device is: its UUID, name, serial, VBIOS version, minor, PCI and
// memory, compute capability, brand and architecture.
func (n *node) answerIdentity(g *gpuState, slot int, req *request, resp *response) {
	switch req.Op {
	case opUUID:
		if slot > 0 {
			resp.setStr(g.migUUIDs[slot-1])
		} else {
			resp.setStr(g.uuid)
		}
	case opName:
		name := n.sc.Model
		if slot > 0 {
			name += " MIG"
		}
		resp.setStr(name)
	case opSerial:
		resp.setStr(g.serial) // what the simulated dcgmi and the sim backend give too
	case opVBIOS:
		resp.setStr(n.sc.VBIOS) // one for the node's boards, as the sim backend's
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
	}
}

// answerSensors serves the temperature and its thresholds, the power and the clock-event
// reasons.
func (g *gpuState) answerSensors(req *request, resp *response) {
	switch req.Op {
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
	}
}

// answerMemory serves the ECC mode and counters, the row remapper and page retirement, and the
// SRAM ECC status. A MIG device has no memory readings of its own.
func (g *gpuState) answerMemory(mig bool, req *request, resp *response) {
	switch req.Op {
	case opECCMode:
		resp.V[0], resp.V[1] = 1, 1
	case opECCTotal:
		if mig {
			resp.Ret = retNotSupported
			return
		}
		g.answerECCTotal(req, resp)
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
	}
}

// answerECCTotal serves an ECC counter: corrected or uncorrected (A), volatile or aggregate (B).
func (g *gpuState) answerECCTotal(req *request, resp *response) {
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
}

// answerPCIe serves the PCIe replay counter and the link's generation and width.
func (g *gpuState) answerPCIe(req *request, resp *response) {
	switch req.Op {
	case opPCIeReplays:
		resp.V[0] = uint64(g.pcieReplays)
		switch {
		case glitch(g.outOfRange, "pcieReplays"):
			resp.V[0] = math.MaxUint32
		case glitch(g.readsLower, "pcieReplays"):
			resp.V[0] = 0
		}
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
	}
}

// answerNVLink serves a link's state and CRC errors, and the field values: the recovery action
// and the links' recovery counts.
func (g *gpuState) answerNVLink(req *request, resp *response) {
	switch req.Op {
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
		g.answerField(req, resp)
	}
}

// answerField serves one field value (A), stamped with the time it was read.
func (g *gpuState) answerField(req *request, resp *response) {
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
}

// answerFabric serves the GPU's NVLink fabric registration.
func (g *gpuState) answerFabric(resp *response) {
	if g.fabric == fabricNotSupported {
		resp.Ret = retNotSupported
		return
	}
	// The clique and the cluster UUID are what Fabric Manager reports for a registered GPU;
	// the state, the status and the health mask are the scenario's.
	resp.V[0], resp.V[1], resp.V[2] = g.fabric, uint64(g.fabricStatus), 1
	resp.V[3], resp.V[4] = fabricMask(g.fabricHealth)
	resp.setStr("gpuhealth-sim-cl") // NVML_GPU_FABRIC_UUID_LEN (16) bytes
}

// answerMIG serves the GPU's MIG mode and its MIG devices (slot is the device asked).
func (g *gpuState) answerMIG(slot int, req *request, resp *response) {
	switch req.Op {
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
		if slot == 0 {
			resp.Ret = retInvalidArgument
			return
		}
		if req.A == 0 {
			resp.V[0] = uint64(slot) // GPU instance n for MIG device n, as the sim backend has it
		}
	}
}

// answerEvents serves the event types the GPU supports and registrations of them on a set of
// process pid.
func (n *node) answerEvents(pid uint32, g *gpuState, req *request, resp *response) {
	switch req.Op {
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
	}
}
