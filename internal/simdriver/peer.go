package simdriver

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Who is at the other end of the socket, and what it may do.
//
// The socket is open to every user (SocketMode), as /dev/nvidiactl is on a real node: any process,
// on the node or in a container, may read the simulated GPUs. Who a peer is comes from the kernel,
// never from what the peer says: SO_PEERCRED's pid and uid, taken when it connected. Changing what
// the GPUs do (an injected event, a GPU reset) is the node's own business, as a reset takes root
// on a real node: a peer may only when its uid is root's, the simulator's own or one of
// Options.InjectUIDs, and it runs in the simulator's own pid namespace. The namespace is what tells
// a tenant's container from the node: a container that runs as root without a user namespace is
// uid 0 to the kernel, but lives in a pid namespace of its own.

// SocketMode is the mode of the simulator's socket, set whatever the umask: read-write for every
// user, as NVIDIA's /dev/nvidiactl is, because NVML consumers run as any user (nvidia-smi, device
// plugins and workloads in containers). The peer's credentials, not the mode, keep other users
// from changing the GPUs: a mode never stops root, which a container's root is.
const SocketMode os.FileMode = 0o666

// peer is the process at the other end of a connection, as the kernel reports it.
type peer struct {
	// pid is the process's ID in the simulator's pid namespace; 0 when that namespace cannot see
	// the process (a simulator in a pid namespace of its own, the process outside it).
	pid uint32
	uid uint32
	raw syscall.RawConn
}

// peerOf reads the credentials the peer of c had when it connected.
func peerOf(c net.Conn) (peer, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return peer{}, fmt.Errorf("a %T has no peer credentials", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peer{}, err
	}
	if credErr != nil {
		return peer{}, fmt.Errorf("reading the peer's credentials (SO_PEERCRED): %w", credErr)
	}
	return peer{pid: uint32(cred.Pid), uid: cred.Uid, raw: raw}, nil
}

// hiddenPIDs marks the process keys of peers the simulator's pid namespace cannot see. Linux
// pids stay below 2^22 (PID_MAX_LIMIT), so no key of a visible process has this bit.
const hiddenPIDs = 1 << 31

// process is the key of the peer's process, under which its NVML sessions and event sets are
// kept: its pid as the kernel gives it. claimed is the pid its HELLO says, taken only for a
// process the simulator cannot see, in a range of keys of its own: such a process can pose only
// as another process the simulator cannot see, never as one it can.
func (p peer) process(claimed uint32) uint32 {
	if p.pid != 0 {
		return p.pid
	}
	return hiddenPIDs | claimed
}

// accessPolicy says which peers may change what the simulated GPUs do.
type accessPolicy struct {
	uid  uint32   // the simulator's own (effective) uid
	more []uint32 // Options.InjectUIDs
}

// check returns nil when p may change what the GPUs do, or why not.
func (a accessPolicy) check(p peer) error {
	who := fmt.Sprintf("pid %d (uid %d)", p.pid, p.uid)
	if p.uid != 0 && p.uid != a.uid && !slices.Contains(a.more, p.uid) {
		allowed := fmt.Sprintf("root and the simulator's own uid %d", a.uid)
		if len(a.more) > 0 {
			allowed = fmt.Sprintf("root, the simulator's own uid %d and --inject-uid %v", a.uid, a.more)
		}
		return fmt.Errorf("%s: only %s may change what the simulated GPUs do", who, allowed)
	}
	if err := p.inSimulatorPIDNamespace(); err != nil {
		return fmt.Errorf("%s %w: only processes of the simulator's own pid namespace (the node's, not a container's) may change what the simulated GPUs do", who, err)
	}
	return nil
}

// inSimulatorPIDNamespace returns nil when the process that connected runs in the simulator's
// own pid namespace, or what the simulator knows of it. A process it can see (pid != 0) runs in
// its namespace or in one below it (a container's); the two are told apart by how many
// namespaces deep each sits under /proc's (the number of pids of NSpid). The process is known by
// a pidfd from the socket where the kernel has SO_PEERPIDFD (Linux 6.5): a process that exits
// after connecting, its pid taken by another, still answers for itself.
func (p peer) inSimulatorPIDNamespace() error {
	if p.pid == 0 {
		return errors.New("runs in a pid namespace the simulator cannot see")
	}
	own, err := nsDepth("/proc/self/status")
	if err != nil {
		return fmt.Errorf("cannot be placed: the simulator's own pid namespace: %w", err)
	}
	var pidfd int
	var pidfdErr error
	if err := p.raw.Control(func(fd uintptr) {
		pidfd, pidfdErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return fmt.Errorf("cannot be placed: %w", err)
	}
	var depth int
	switch {
	case pidfdErr == nil:
		depth, err = nsDepth(fmt.Sprintf("/proc/self/fdinfo/%d", pidfd))
		_ = unix.Close(pidfd)
	case errors.Is(pidfdErr, unix.ENOPROTOOPT) && own == 1:
		// No SO_PEERPIDFD (before Linux 6.5): the process by its pid, in a /proc of the
		// simulator's own namespace.
		depth, err = nsDepth("/proc/" + strconv.FormatUint(uint64(p.pid), 10) + "/status")
	default:
		err = fmt.Errorf("no pidfd of it (SO_PEERPIDFD): %w", pidfdErr)
	}
	switch {
	case err != nil:
		return fmt.Errorf("cannot be placed: %w", err)
	case depth != own:
		return errors.New("runs in a pid namespace of its own (a container's)")
	}
	return nil
}

// errExited: the process that connected has exited (a pidfd's Pid is -1), or /proc cannot see it
// (0).
var errExited = errors.New("the process has exited (or /proc cannot see it)")

// nsDepth reads a /proc status or pidfd fdinfo file: how many pid namespaces, from /proc's down
// to the process's own, the process has a pid in (the fields of its NSpid line).
func nsDepth(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(data) {
		rest, ok := bytes.CutPrefix(line, []byte("NSpid:"))
		if !ok {
			continue
		}
		pids := bytes.Fields(rest)
		if len(pids) == 0 || bytes.HasPrefix(pids[0], []byte("-")) || string(pids[0]) == "0" {
			return 0, errExited
		}
		return len(pids), nil
	}
	return 0, fmt.Errorf("%s has no NSpid line", path)
}

// permit checks that who may do what (an injection, a GPU reset), and logs a refusal.
func (s *server) permit(who peer, what string) error {
	err := s.access.check(who)
	if err != nil {
		s.log.Info("Refused: the process may not change what the simulated GPUs do", "what", what, "pid", who.pid, "uid", who.uid, "reason", err.Error())
	}
	return err
}
