package simdriver

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// Options configure Serve.
type Options struct {
	// Scenario is what the simulated GPUs do (checked with CheckScenario first).
	Scenario *sim.Scenario
	// DriverRoot is where the library is installed (Install).
	DriverRoot string
	// Version is the driver profile ("550.163.01", or a branch such as "535"; "" the newest).
	Version string
	// LibraryDir holds the built libraries, <version>/libnvidia-ml.so.<version>
	// (hack/sim-driver.sh); "" is DefaultLibraryDir().
	LibraryDir string
	// LibrarySubdir is the directory inside the driver root the library goes to (Install).
	LibrarySubdir string
	Logger        logr.Logger
	// Ready, when set, is called once the socket listens.
	Ready func()
	// Clock paces the scenario's timeline (default the real clock; tests run long scenarios on
	// a faster one).
	Clock clock.Clock
	// OnRegister, when set, hears of every event registration: the process, the GPU index and
	// the event types (tests wait for their consumers with it).
	OnRegister func(pid uint32, gpu int, types uint64)
	// DCGMVersion is the DCGM version the installed dcgmi speaks (sim.DCGMVersion4 when empty;
	// 3.x gives 3.x's JSON).
	DCGMVersion string

	node func(*node) // tests: the simulator's state
}

// Serve installs the simulated driver into the driver root and serves the scenario's GPUs on
// the real clock until ctx ends. Then the socket is removed and every connection closed: the
// library stays, and answers as a driver that is not loaded until a simulator serves again.
func Serve(ctx context.Context, o Options) error {
	if err := CheckScenario(o.Scenario); err != nil {
		return err
	}
	inst, err := Install(o.DriverRoot, o.Version, o.LibraryDir, o.LibrarySubdir)
	if err != nil {
		return err
	}
	if err := installDeviceNodes(o.DriverRoot, o.Scenario.GPUCount); err != nil {
		o.Logger.Info("Serving without device nodes", "reason", err.Error())
	}
	if o.DCGMVersion == "" {
		o.DCGMVersion = sim.DCGMVersion4
	}
	// The dcgmi runs this very binary: the simulator is the node's DCGM host engine.
	if exe, err := os.Executable(); err != nil {
		o.Logger.Info("Serving without dcgmi", "reason", err.Error())
	} else if path, err := InstallDCGMI(o.DriverRoot, exe, o.DCGMVersion); err != nil {
		o.Logger.Info("Serving without dcgmi", "reason", err.Error())
	} else {
		o.Logger.Info("DCGM's dcgmi installed", "path", path, "dcgmVersion", o.DCGMVersion)
	}
	lis, err := listen(inst.Socket)
	if err != nil {
		return err
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	s := &server{node: newNode(o.Scenario, func(msg string, kv ...any) { o.Logger.Info(msg, kv...) }), log: o.Logger,
		clock: o.Clock, conns: map[net.Conn]uint32{}, perPID: map[uint32]int{}, version: inst.Version}
	s.node.onRegister = o.OnRegister
	if o.node != nil {
		o.node(s.node)
	}
	// What happens at 0s is there before the first consumer can look.
	pending := slices.Clone(o.Scenario.Events)
	for len(pending) > 0 && pending[0].At <= 0 {
		_ = s.node.apply(pending[0]) // nobody holds the driver before it serves
		if pending[0].Kind == sim.EventReset {
			pending = afterReset(pending[1:], o.Scenario, pending[0].GPU, 0)
			continue
		}
		pending = pending[1:]
	}
	o.Logger.Info("Simulated NVIDIA driver serving", "driverRoot", o.DriverRoot, "version", inst.Version, "library", inst.Library,
		"gpus", o.Scenario.GPUCount, "node", o.Scenario.Node)
	if o.Ready != nil {
		o.Ready()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.timeline(ctx, o.Scenario, pending)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		_ = lis.Close()
		s.closeAll()
	}()
	var serveErr error
	for {
		c, err := lis.Accept()
		if err != nil {
			if ctx.Err() == nil {
				serveErr = fmt.Errorf("accepting on %s: %w", inst.Socket, err)
				cancel()
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, c)
		}()
	}
	wg.Wait()
	if err := os.Remove(inst.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		serveErr = errors.Join(serveErr, err)
	}
	return serveErr
}

// listen listens on the socket, taking over one a killed simulator left behind, and refusing
// one another simulator still serves.
func listen(path string) (net.Listener, error) {
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		return nil, fmt.Errorf("another simulator already serves %s", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o666); err != nil { // consumers run as any user, as with /dev/nvidia*
		_ = lis.Close()
		return nil, err
	}
	return lis, nil
}

type server struct {
	node  *node
	log   logr.Logger
	clock clock.Clock
	// version is the driver profile served: a library of another version is refused, as the
	// kernel module refuses a libnvidia-ml of another version (LIB_RM_VERSION_MISMATCH).
	version string

	mu     sync.Mutex
	conns  map[net.Conn]uint32 // connection -> pid
	perPID map[uint32]int

	// diagMu guards diagRunning: one DCGM diagnostic at a time, as one host engine runs one
	// nvvs (dcgm.go).
	diagMu      sync.Mutex
	diagRunning bool
}

func (s *server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		_ = c.Close()
	}
}

// timeline applies the scenario's events at their time from now, and each GPU's afterReset
// events after every reset of it.
func (s *server) timeline(ctx context.Context, sc *sim.Scenario, pending []sim.Event) {
	start := s.clock.Now()
	for len(pending) > 0 {
		ev := pending[0]
		pending = pending[1:]
		if !s.sleep(ctx, start.Add(ev.At).Sub(s.clock.Now())) {
			return
		}
		if ev.Kind == sim.EventReset {
			if s.applyReset(ev) {
				pending = afterReset(pending, sc, ev.GPU, ev.At)
			}
			continue
		}
		if !s.applyRetrying(ctx, ev) {
			return
		}
	}
}

// applyReset applies a timeline reset. While a process holds NVML it is refused, as `nvidia-smi
// --gpu-reset` refuses a GPU another process has open, and logged: the scenario's afterReset
// events do not follow a reset that did not happen. It reports whether the GPU was reset.
func (s *server) applyReset(ev sim.Event) bool {
	s.node.mu.Lock()
	err := s.node.apply(ev)
	s.node.mu.Unlock()
	if err != nil {
		s.log.Info("GPU reset refused", "line", ev.Line, "gpu", ev.GPU, "reason", err.Error())
		return false
	}
	return true
}

// applyRetrying applies a timeline event; an unload that processes hold is tried again every
// second until they let go, as the GPU operator's driver manager keeps trying to unload the
// module. It returns false when ctx ends first.
func (s *server) applyRetrying(ctx context.Context, ev sim.Event) bool {
	said := false
	for {
		s.node.mu.Lock()
		err := s.node.apply(ev)
		s.node.mu.Unlock()
		if err == nil {
			return true
		}
		if !said {
			s.log.Info("Driver unload refused; trying again every second", "line", ev.Line, "reason", err.Error())
			said = true
		}
		if !s.sleep(ctx, time.Second) {
			return false
		}
	}
}

func afterReset(events []sim.Event, sc *sim.Scenario, gpu int, at time.Duration) []sim.Event {
	for _, ev := range sc.AfterReset {
		if ev.GPU != gpu {
			continue
		}
		ev.At += at
		i := 0
		for i < len(events) && events[i].At <= ev.At {
			i++
		}
		events = append(events[:i], append([]sim.Event{ev}, events[i:]...)...)
	}
	return events
}

// sleep waits d on the timeline's clock; it returns false when ctx ends first.
func (s *server) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	select {
	case <-s.clock.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}

// sleepUntil waits until t on the real clock (a hanging call hangs for real).
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// serveConn serves one connection: a HELLO, then calls until the peer goes.
func (s *server) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, reqSize*4)
	var req request
	if err := readRequest(r, &req); err != nil {
		return
	}
	var resp response
	switch req.Op {
	case opInject:
		s.inject(c, r, &req)
		return
	case opDiag:
		s.diag(ctx, c, r, &req)
		return
	case opDiscovery:
		s.discovery(c)
		return
	case opHello:
	default:
		return
	}
	pid := req.A
	if req.B != wireVersion {
		resp.Ret = retUnknown
		_ = writeResponse(c, &resp)
		s.log.Info("A library of another wire version connected: refused", "pid", pid, "version", req.B)
		return
	}
	if lib := req.str(); lib != s.version {
		// A process that loaded the library of the driver served before (a driver upgrade
		// under it): NVIDIA's "Driver/library version mismatch".
		resp.Ret = retLibRMVersionMismatch
		_ = writeResponse(c, &resp)
		s.log.Info("A library of another driver version connected: answered LIB_RM_VERSION_MISMATCH", "pid", pid, "library", lib, "driver", s.version)
		return
	}
	if err := writeResponse(c, &resp); err != nil {
		return
	}
	s.mu.Lock()
	s.conns[c] = pid
	s.perPID[pid]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.perPID[pid]--
		last := s.perPID[pid] == 0
		if last {
			delete(s.perPID, pid)
		}
		s.mu.Unlock()
		if last {
			s.node.mu.Lock()
			s.node.closeProcess(pid)
			s.node.mu.Unlock()
		}
	}()
	for {
		if err := readRequest(r, &req); err != nil {
			return
		}
		resp = response{}
		if req.Op == opEventSetWait {
			if !s.waitWatching(ctx, c, r, pid, &req, &resp) {
				return // the consumer died in the middle of its wait
			}
		} else {
			s.node.mu.Lock()
			hangUntil := s.node.answer(pid, &req, &resp)
			s.node.mu.Unlock()
			if !sleepUntil(ctx, hangUntil) { // a wedged GPU answers late
				return
			}
		}
		if err := writeResponse(c, &resp); err != nil {
			return
		}
	}
}

// waitWatching serves nvmlEventSetWait while watching the connection: the consumer's thread
// sends nothing while it waits for this answer, so anything readable (the end of the stream
// above all) means the consumer is gone, and the wait ends at once instead of at its timeout. It
// returns false then.
func (s *server) waitWatching(ctx context.Context, c net.Conn, r *bufio.Reader, pid uint32, req *request, resp *response) bool {
	gone := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if _, err := r.Peek(1); !isTimeout(err) {
			close(gone) // EOF, an error, or bytes no live consumer would send now
		}
	}()
	s.wait(ctx, pid, req, resp, gone)
	_ = c.SetReadDeadline(time.Now()) // ends the Peek
	<-watched
	_ = c.SetReadDeadline(time.Time{})
	select {
	case <-gone:
		return false
	default:
		return true
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// wait serves nvmlEventSetWait: the next event, or TIMEOUT after the call's timeout. It ends
// early when gone is closed.
func (s *server) wait(ctx context.Context, pid uint32, req *request, resp *response, gone <-chan struct{}) {
	deadline := time.Now().Add(time.Duration(req.B) * time.Millisecond)
	for {
		s.node.mu.Lock()
		wake, done := s.node.next(pid, req.A, resp)
		s.node.mu.Unlock()
		if done {
			return
		}
		d := time.Until(deadline)
		if d <= 0 {
			resp.Ret = retTimeout
			return
		}
		timer := time.NewTimer(d)
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			resp.Ret = retUnknown
		case <-gone:
			resp.Ret = retUnknown
		}
		timer.Stop()
		if resp.Ret != retSuccess {
			return
		}
	}
}

// maxInject bounds an injected event's YAML.
const maxInject = 64 << 10

// inject applies one event from `sim-driver inject`: C bytes of YAML follow the request; the
// answer is the response and, on error, the message's length and bytes.
func (s *server) inject(c net.Conn, r io.Reader, req *request) {
	var resp response
	msg := ""
	if req.C > maxInject {
		msg = fmt.Sprintf("the event is %d bytes, more than %d", req.C, maxInject)
	} else {
		body := make([]byte, req.C)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		s.node.mu.Lock()
		ev, err := parseEvent(s.node.sc, body)
		refused := false
		if err == nil {
			if err = s.node.apply(ev); err == nil {
				s.log.Info("Injected", "event", string(body))
			} else {
				refused = true
			}
		}
		s.node.mu.Unlock()
		if err != nil {
			msg = err.Error()
		}
		if refused {
			resp.N = 1 // valid, but the driver refused it now: not bad input
		}
	}
	if msg != "" {
		resp.Ret = retInvalidArgument
	}
	_ = writeResponse(c, &resp)
	_ = binary.Write(c, binary.LittleEndian, uint32(len(msg)))
	_, _ = io.WriteString(c, msg)
}

// SocketPath is where the simulator of a driver root listens when the library is in the
// default library directory.
func SocketPath(driverRoot string) string {
	return filepath.Join(driverRoot, libDir(), SocketName)
}
