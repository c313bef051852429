//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// process is a binary a test started (a device plugin, an example), its output in a log file.
// It dies with the test binary (Pdeathsig), is stopped when the test ends, and its log tail is
// shown when the test failed.
type process struct {
	name    string
	cmd     *exec.Cmd
	log     string
	started time.Time
	done    chan struct{}
}

// startProcess starts bin with args, logging to logPath; name labels it in test output.
func startProcess(t *testing.T, name, logPath, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, log: logPath, done: make(chan struct{})}
	logFile, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("%s log:\n%s", p.name, tail(string(b), 80))
		}
	})
	return p
}

// stop sends SIGTERM and waits up to 15s, then kills; a process that has already ended is left
// alone.
func (p *process) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Errorf("%s did not stop within 15s of SIGTERM", p.name)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited reports whether the process has ended, with its log tail.
func (p *process) exited() (bool, string) {
	select {
	case <-p.done:
		b, _ := os.ReadFile(p.log)
		return true, tail(string(b), 30)
	default:
		return false, ""
	}
}
