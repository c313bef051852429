package simdriver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
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
	// InjectUIDs are the users, besides root and the simulator's own, whose processes may
	// change what the GPUs do (Inject, a GPU reset), from the simulator's pid namespace (peer.go).
	InjectUIDs []uint32

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
		clock: o.Clock, conns: map[net.Conn]uint32{}, perPID: map[uint32]int{}, version: inst.Version,
		access: accessPolicy{uid: uint32(os.Geteuid()), more: o.InjectUIDs}}
	s.node.onRegister = o.OnRegister
	if o.node != nil {
		o.node(s.node)
	}
	// What happens at 0s is there before the first consumer can look.
	pending := s.applyAtStart(o.Scenario)
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
	// The mode net.Listen gave depends on the umask: set the one that is meant.
	if err := os.Chmod(path, SocketMode); err != nil {
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
	// access says who may change what the GPUs do (peer.go).
	access accessPolicy

	mu     sync.Mutex
	conns  map[net.Conn]uint32 // connection -> process key (peer.process)
	perPID map[uint32]int      // process key -> connections

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
