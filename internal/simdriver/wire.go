package simdriver

import (
	"encoding/binary"
	"io"
	"math"
)

// The wire between the simulated libnvidia-ml.so.1 and the simulator: c/sim_wire.h, mirrored
// here. TestWireMatchesHeader keeps the two in step.
const (
	wireVersion = 1
	wireStr     = 96
	wireValues  = 8
	migSlots    = 8
	// SocketName is the simulator's socket, beside the library in the driver root.
	SocketName = "gpuhealth-sim-driver.sock"

	reqSize  = 4*4 + 8 + wireStr
	respSize = 4 + 4 + 8*wireValues + wireStr
)

type op uint32

const (
	opHello op = iota + 1
	opInit
	opShutdown
	opCount
	opByUUID
	opByPCI
	opUUID
	opName
	opSerial
	opMinor
	opPCI
	opMemory
	opCudaCC
	opBrand
	opArch
	opTemp
	opTempThreshold
	opECCMode
	opECCTotal
	opRemappedRows
	opRetiredPending
	opPower
	opClockReasons
	opPCIeReplays
	opNVLinkState
	opNVLinkErrors
	opField
	opMIGMode
	opMIGMax
	opMIGHandle
	opMIGIDs
	opFabric
	opEventSetCreate
	opEventSetFree
	opRegisterEvents
	opSupportedEvents
	opEventSetWait
	opUnsupported
	opInject
	opReset
	opRowRemapHistogram
	opSRAMStatus
	opPCIeLink
	// opDiag runs a DCGM diagnostic of GPU dev at run level a, timeout b seconds (0: none), on a
	// connection of its own (dcgm.go); c bytes of the dcgmi command line follow, for the log.
	opDiag
	// opDiscovery lists the GPUs as DCGM's discovery does, on a connection of its own.
	opDiscovery
	// opVBIOS answers the GPU's VBIOS version (nvmlDeviceGetVbiosVersion): the scenario's.
	opVBIOS
	opLast
)

// request is struct sim_req.
type request struct {
	Op  op
	Dev uint32
	A   uint32
	B   uint32
	C   uint64
	S   [wireStr]byte
}

// response is struct sim_resp.
type response struct {
	Ret int32
	N   uint32
	V   [wireValues]uint64
	S   [wireStr]byte
}

func (r *request) str() string { return cString(r.S[:]) }

func (r *response) setStr(s string) {
	clear(r.S[:])
	copy(r.S[:wireStr-1], s)
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// The structs are encoded by hand, without reflection: a call's round trip is the simulated
// driver's whole cost.

func readRequest(r io.Reader, req *request) error {
	var b [reqSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	le := binary.LittleEndian
	req.Op, req.Dev, req.A, req.B = op(le.Uint32(b[0:])), le.Uint32(b[4:]), le.Uint32(b[8:]), le.Uint32(b[12:])
	req.C = le.Uint64(b[16:])
	copy(req.S[:], b[24:])
	return nil
}

func writeRequest(w io.Writer, req *request) error {
	var b [reqSize]byte
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(req.Op))
	le.PutUint32(b[4:], req.Dev)
	le.PutUint32(b[8:], req.A)
	le.PutUint32(b[12:], req.B)
	le.PutUint64(b[16:], req.C)
	copy(b[24:], req.S[:])
	_, err := w.Write(b[:])
	return err
}

func readResponse(r io.Reader, resp *response) error {
	var b [respSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	le := binary.LittleEndian
	resp.Ret, resp.N = int32(le.Uint32(b[0:])), le.Uint32(b[4:])
	for i := range resp.V {
		resp.V[i] = le.Uint64(b[8+8*i:])
	}
	copy(resp.S[:], b[8+8*wireValues:])
	return nil
}

func writeResponse(w io.Writer, resp *response) error {
	var b [respSize]byte
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(resp.Ret))
	le.PutUint32(b[4:], resp.N)
	for i, v := range resp.V {
		le.PutUint64(b[8+8*i:], v)
	}
	copy(b[8+8*wireValues:], resp.S[:])
	_, err := w.Write(b[:])
	return err
}

// NVML's values (nvml.h) the simulator answers with. They are facts of the C ABI, written here
// because only pkg/gpu/nvml may import go-nvml.
const (
	retSuccess              = 0
	retUninitialized        = 1
	retInvalidArgument      = 2
	retNotSupported         = 3
	retNoPermission         = 4
	retNotFound             = 6
	retInsufficientSize     = 7
	retDriverNotLoaded      = 9
	retTimeout              = 10
	retGPUIsLost            = 15
	retResetRequired        = 16
	retLibRMVersionMismatch = 18
	retInUse                = 19
	retArgVersionMismatch   = 25
	retUnknown              = 999

	eventSingleBitECC      = 0x1
	eventDoubleBitECC      = 0x2
	eventXID               = 0x8
	eventDRAMRetirement    = 0x400
	eventDRAMRetireFailure = 0x800
	eventGPUUnavailable    = 0x4000
	eventRecoveryAction    = 0x8000
	eventMIGConfigChange   = 0x100
	supportedEvents        = eventSingleBitECC | eventDoubleBitECC | eventXID | eventDRAMRetirement | eventDRAMRetireFailure | eventGPUUnavailable | eventRecoveryAction | eventMIGConfigChange

	thresholdShutdown = 0
	thresholdSlowdown = 1

	eccCorrected   = 0
	eccUncorrected = 1
	eccVolatile    = 0
	eccAggregate   = 1

	brandNVIDIA = 14
	archHopper  = 9

	fieldRecoveryAction           = 230
	fieldNVLinkRecoverySuccessful = 213 // NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS, the link as scope
	fieldNVLinkRecoveryFailed     = 214 // …_FAILED_EVENTS
	valueTypeUint                 = 1
	valueTypeULongLong            = 3

	// The parts of the PCIe link opPCIeLink answers (its a).
	pcieCurrGen    = 0
	pcieCurrWidth  = 1
	pcieMaxGen     = 2 // of this device and system
	pcieMaxWidth   = 3
	pcieGPUMaxGen  = 4 // of the GPU alone
	pcieLinkGlitch = math.MaxUint32

	// NVML_GPU_FABRIC_HEALTH_MASK_*: each field two bits, 1 TRUE, 2 FALSE.
	fabricHealthTrue              = 1
	fabricHealthFalse             = 2
	fabricShiftDegradedBW         = 0
	fabricShiftRouteRecovery      = 2
	fabricShiftRouteUnhealthy     = 4
	fabricShiftAccessTimeoutRecov = 6

	// NVML_GPU_FABRIC_STATE_*
	fabricNotSupported = 0
	fabricCompleted    = 3

	noInstance = 0xFFFFFFFF
)
