package simdriver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// The simulator as the node's DCGM host engine: it holds each GPU's diagnostic state (the
// scenario's diag and latent events, and injects) and runs one diagnostic at a time, as
// nv-hostengine runs one nvvs. The simulated dcgmi (dcgmi.go) asks it over the socket, each
// request on a connection of its own, and renders what it answers with pkg/gpu/sim's writer.
// The C library knows nothing of it.

// Outcomes of a diagnostic request.
const (
	diagRan    = "ran"    // the tests ran on the GPU's state
	diagBusy   = "busy"   // another diagnostic runs: DCGM_ST_DIAG_ALREADY_RUNNING
	diagKilled = "killed" // a hanging one was killed at the request's timeout
	diagNoGPU  = "noGPU"  // no GPU has that id
)

// diagReply is the simulator's answer to opDiag: JSON after the response, its length first.
type diagReply struct {
	Outcome       string         `json:"outcome"`
	State         sim.DiagState  `json:"state"`
	Lost          bool           `json:"lost,omitempty"`
	Device        sim.DCGMDevice `json:"device"`
	DriverVersion string         `json:"driverVersion"`
}

// discoveryReply is the answer to opDiscovery: the GPUs by DCGM id (their index).
type discoveryReply struct {
	GPUs []sim.DCGMDevice `json:"gpus"`
}

// maxReply bounds a reply's JSON.
const maxReply = 1 << 20

// diag serves opDiag. A GPU whose state is unreachable gets no answer at all: the connection
// closes, as a host engine that does not answer. One whose state is hang holds the host engine
// until the request's timeout (then it is killed, as DCGM kills nvvs), until the dcgmi goes away
// (its signal handler stops the diagnostic), or until the simulator stops.
func (s *server) diag(ctx context.Context, c net.Conn, r *bufio.Reader, req *request) {
	if req.C > maxInject {
		return
	}
	cmdline := make([]byte, req.C)
	if _, err := io.ReadFull(r, cmdline); err != nil {
		return
	}
	gpu, level := int(req.Dev), int(req.A)
	reply := diagReply{DriverVersion: s.version}
	s.node.mu.Lock()
	if gpu < len(s.node.gpus) {
		g := s.node.gpus[gpu]
		reply.State, reply.Lost = g.diag, g.lost
		reply.Device = sim.DCGMDevice{Name: s.node.sc.Model, UUID: g.uuid, PCIBusID: g.busID, Serial: g.serial, DeviceID: sim.PCIDeviceID}
	} else {
		reply.Outcome = diagNoGPU
	}
	s.node.mu.Unlock()
	log := s.log.WithValues("gpu", gpu, "level", level, "command", string(cmdline))
	switch {
	case reply.Outcome == diagNoGPU:
		log.Info("DCGM diagnostic of no GPU")
		writeReply(c, reply)
		return
	case reply.State.Word == sim.DiagUnreachable:
		log.Info("DCGM diagnostic not answered: the host engine is unreachable (diag: unreachable)")
		return
	}
	s.diagMu.Lock()
	busy := s.diagRunning
	s.diagRunning = true
	s.diagMu.Unlock()
	if busy {
		reply.Outcome = diagBusy
		log.Info("DCGM diagnostic refused: another one runs")
		writeReply(c, reply)
		return
	}
	defer func() {
		s.diagMu.Lock()
		s.diagRunning = false
		s.diagMu.Unlock()
	}()
	reply.Outcome = diagRan
	if reply.State.Word == sim.DiagHang && !reply.Lost {
		log.Info("DCGM diagnostic hangs", "timeoutSeconds", req.B)
		if !s.hang(ctx, c, r, time.Duration(req.B)*time.Second) {
			log.Info("DCGM diagnostic stopped: dcgmi went away")
			return
		}
		reply.Outcome = diagKilled
	}
	log.Info("DCGM diagnostic", "outcome", reply.Outcome, "word", reply.State.Word, "latentXID", reply.State.LatentXID, "lost", reply.Lost)
	writeReply(c, reply)
}

// hang waits until timeout (none when 0) and returns true, or returns false when the dcgmi's
// connection ends (anything readable means it is gone: it sends nothing while it waits) or ctx
// does.
func (s *server) hang(ctx context.Context, c net.Conn, r *bufio.Reader, timeout time.Duration) bool {
	gone := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if _, err := r.Peek(1); !isTimeout(err) {
			close(gone)
		}
	}()
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	killed := false
	select {
	case <-expired:
		killed = true
	case <-gone:
	case <-ctx.Done():
	}
	_ = c.SetReadDeadline(time.Now()) // ends the Peek
	<-watched
	_ = c.SetReadDeadline(time.Time{})
	return killed
}

// discovery serves opDiscovery.
func (s *server) discovery(c net.Conn) {
	var reply discoveryReply
	s.node.mu.Lock()
	for _, g := range s.node.gpus {
		reply.GPUs = append(reply.GPUs, sim.DCGMDevice{Name: s.node.sc.Model, UUID: g.uuid, PCIBusID: g.busID, Serial: g.serial, DeviceID: sim.PCIDeviceID})
	}
	s.node.mu.Unlock()
	writeReply(c, reply)
}

// writeReply writes a response and v as JSON, its length first.
func writeReply(c net.Conn, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		return
	}
	var resp response
	_ = writeResponse(c, &resp)
	_ = binary.Write(c, binary.LittleEndian, uint32(len(body)))
	_, _ = c.Write(body)
}

// errUnreachable: no simulator answered, as no host engine would.
var errUnreachable = errors.New("the simulated host engine does not answer")

// ask sends req (and body) to the simulator on socket and decodes its reply into v. A simulator
// that is not there, refuses, or hangs up without answering is errUnreachable. ctx ends the wait.
func ask(ctx context.Context, socket string, req *request, body []byte, v any) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnreachable, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	// The request and its body in one write, as Inject sends them.
	req.C = uint64(len(body))
	var msg bytes.Buffer
	if err := writeRequest(&msg, req); err != nil {
		return err
	}
	msg.Write(body)
	if _, err := c.Write(msg.Bytes()); err != nil {
		return unreachable(ctx, err)
	}
	var resp response
	if err := readResponse(c, &resp); err != nil {
		return unreachable(ctx, err)
	}
	var n uint32
	if err := binary.Read(c, binary.LittleEndian, &n); err != nil {
		return unreachable(ctx, err)
	}
	if n > maxReply {
		return fmt.Errorf("the simulator's reply is %d bytes, more than %d", n, maxReply)
	}
	reply := make([]byte, n)
	if _, err := io.ReadFull(c, reply); err != nil {
		return unreachable(ctx, err)
	}
	return json.Unmarshal(reply, v)
}

// unreachable tells a connection the simulator dropped from one ctx ended.
func unreachable(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %w", errUnreachable, err)
}
