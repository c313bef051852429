package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one control-plane binary we started. Its stdout and stderr go straight to a log file
// (the child holds the file descriptor, so no copying goroutine is needed and a detached child
// keeps logging after we exit).
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	// binary is what the process runs once started: cmd.Path, unless a launcher (nsenter) execs
	// into it. cluster.sh checks /proc/PID/exe against it before signalling a recorded PID.
	binary string
	// ports the process must listen on before it counts as ready; set before waitReady.
	ports []int
	// done is closed by the waiter goroutine when the child exits; waitErr is valid after that.
	// A detached child outlives us; its waiter simply ends with our process.
	done    chan struct{}
	waitErr error

	stopOnce sync.Once
	stopErr  error
}

// startProcess starts bin with args, logging to logPath.
//
// Attached children (tests) get their own process group, so a terminal's Ctrl-C goes to the test
// binary only and we stop the children in order, and Pdeathsig=SIGKILL, so the kernel kills them
// if the test binary dies without cleaning up (go test's timeout, kill -9). Pdeathsig fires when
// the forking OS thread exits; Go only ends threads of goroutines that exit while locked with
// runtime.LockOSThread, which nothing here does.
//
// Detached children (cluster-up) get their own session instead, so they survive the launcher and
// its terminal.
func startProcess(name, bin string, args []string, logPath string, detached bool) (*process, error) {
	return startProcessWith(name, bin, args, logPath, detached, nil)
}

// startProcessWith is startProcess with a hook that adjusts the command before it starts (extra
// clone flags, inherited files).
func startProcessWith(name, bin string, args []string, logPath string, detached bool, configure func(*exec.Cmd)) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log for %s: %w", name, err)
	}
	// The child has its own copy of the descriptor after Start.
	defer func() { _ = logFile.Close() }()
	fmt.Fprintf(logFile, "+ %s %q\n", bin, args)

	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = os.Environ()
	if detached {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	if configure != nil {
		configure(cmd)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, binary: cmd.Path, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the child has exited, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the child's process group, waits up to grace, then sends SIGKILL. It is
// idempotent.
func (p *process) stop(grace time.Duration) error {
	p.stopOnce.Do(func() {
		if ok, _ := p.exited(); ok {
			return
		}
		if err := signalGroup(p.pid(), syscall.SIGTERM); err != nil {
			p.stopErr = err
		}
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-p.done:
			return
		case <-timer.C:
		}
		if err := signalGroup(p.pid(), syscall.SIGKILL); err != nil {
			p.stopErr = errors.Join(p.stopErr, err)
		}
		<-p.done
	})
	return p.stopErr
}

// signalGroup signals the process group led by pid (every child here leads its own group), so
// anything a component might fork goes too.
func signalGroup(pid int, sig syscall.Signal) error {
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to process group %d: %w", sig, pid, err)
	}
	return nil
}

// tail returns up to the last n lines of the process's log.
func (p *process) tail(n int) string {
	return tailFile(p.logPath, n)
}

// tailFile returns up to the last n lines of a file, reading at most its last 256 KiB.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer func() { _ = f.Close() }()
	const maxRead = 256 << 10
	if info, err := f.Stat(); err == nil && info.Size() > maxRead {
		if _, err := f.Seek(-maxRead, io.SeekEnd); err != nil {
			return fmt.Sprintf("(cannot read %s: %v)", path, err)
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	data = bytes.TrimRight(data, "\n")
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// listensOn reports whether process pid holds a listening TCP socket on port, by matching the
// socket inodes of /proc/PID/net/tcp{,6} against the process's open file descriptors. The tables
// are the process's own, so this works for processes in another network namespace (kubelets).
func listensOn(pid, port int) (bool, error) {
	inodes := map[string]bool{}
	for _, table := range []string{fmt.Sprintf("/proc/%d/net/tcp", pid), fmt.Sprintf("/proc/%d/net/tcp6", pid)} {
		data, err := os.ReadFile(table)
		if errors.Is(err, os.ErrNotExist) {
			continue // no IPv6, or the process has exited (the caller notices)
		}
		if err != nil {
			return false, fmt.Errorf("read %s: %w", table, err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(line)
			if i == 0 || len(fields) < 10 || fields[3] != tcpListen {
				continue
			}
			local := fields[1]
			p, err := strconv.ParseUint(local[strings.LastIndexByte(local, ':')+1:], 16, 16)
			if err == nil && int(p) == port {
				inodes[fields[9]] = true
			}
		}
	}
	if len(inodes) == 0 {
		return false, nil
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(fdDir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // exited; the caller notices
	}
	if err != nil {
		return false, fmt.Errorf("list open files of pid %d: %w", pid, err)
	}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if inode, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(inode, "]")] {
			return true, nil
		}
	}
	return false, nil
}

// tcpListen is the TCP_LISTEN state in /proc/net/tcp.
const tcpListen = "0A"
