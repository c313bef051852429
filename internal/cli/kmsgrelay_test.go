package cli_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/cli"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/test/proccred"
)

const kmsgRelayChildEnv = "GPUHEALTH_KMSG_RELAY_CHILD"

// TestKmsgRelayChild is `gpuhealth kmsg-relay` in a process of its own, as main runs it (stopped
// by SIGTERM): a relay started as root drops the privileges of its whole process.
func TestKmsgRelayChild(t *testing.T) {
	socket := os.Getenv(kmsgRelayChildEnv)
	if socket == "" {
		t.Skip("the child of the kmsg-relay tests")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	code := cli.Execute(ctx, append([]string{"kmsg-relay", "--socket", socket}, strings.Fields(os.Getenv(kmsgRelayChildEnv+"_ARGS"))...), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// relayChild is a running `gpuhealth kmsg-relay` and its log.
type relayChild struct {
	cmd    *exec.Cmd
	socket string
	log    string
}

func startRelayChild(t *testing.T, args ...string) *relayChild {
	t.Helper()
	dir, err := os.MkdirTemp("", "krc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// The relay, once nobody, neither creates nor removes anything here; the test reads its log.
	c := &relayChild{socket: filepath.Join(dir, "run", "relay.sock"), log: filepath.Join(dir, "relay.log")}
	logFile, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestKmsgRelayChild$")
	c.cmd.Env = append(os.Environ(), kmsgRelayChildEnv+"="+c.socket, kmsgRelayChildEnv+"_ARGS="+strings.Join(args, " "))
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	return c
}

func (c *relayChild) logged() string {
	b, _ := os.ReadFile(c.log)
	return string(b)
}

// dial connects once the relay listens, and returns the reader or the relay's refusal.
func (c *relayChild) dial(t *testing.T, boot string) (*kmsg.RelayReader, error) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, err := kmsg.DialRelay(c.socket, boot)
		if !errors.Is(err, kmsg.ErrRelayUnreachable) {
			return r, err
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay never listened: %v\n%s", err, c.logged())
		}
	}
}

// stop sends SIGTERM and returns the exit code.
func (c *relayChild) stop(t *testing.T) int {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	return c.cmd.ProcessState.ExitCode()
}

// credentials returns every thread's credentials of process pid (proccred.Threads).
func credentials(t *testing.T, pid int) []string {
	t.Helper()
	creds, err := proccred.Threads(pid)
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// A relay started as root opens the real kernel log and its socket (0660, root's), then runs as
// nobody with no capability in any thread, says which boot it reads, hands out only records the
// kernel wrote with "NVRM:" (never the line this test writes), and stops cleanly on SIGTERM.
func TestKmsgRelayDropsRootAndRelaysTheRealLog(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the relay drops root")
	}
	if r, err := kmsg.Open(kmsg.DevKmsg); err != nil {
		t.Skipf("cannot read %s here: %v", kmsg.DevKmsg, err)
	} else {
		_ = r.Close()
	}
	boot, err := health.ReadBootID()
	if err != nil {
		t.Fatal(err)
	}
	c := startRelayChild(t)
	client, err := c.dial(t, boot)
	if err != nil {
		t.Fatalf("%v\n%s", err, c.logged())
	}
	defer client.Close()
	st, err := os.Stat(c.socket)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o660 || st.Mode().Type() != fs.ModeSocket || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("socket %v owned by %d, want a socket 0660 of root's", st.Mode(), st.Sys().(*syscall.Stat_t).Uid)
	}
	for _, cred := range credentials(t, c.cmd.Process.Pid) {
		if cred != proccred.Nobody {
			t.Errorf("a thread of the relay has %s, want nobody with no capability", cred)
		}
	}

	marker := fmt.Sprintf("NVRM: Xid (PCI:0000:3b:00): 79, pid=%d, name=relay-test, GPU has fallen off the bus.", time.Now().UnixNano()%1000000)
	w, err := os.OpenFile(kmsg.DevKmsg, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.WriteString(marker + "\n")
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	// What the relay hands out now: the kernel's NVRM records this boot holds, if any, and not
	// the line just written. The reading stops once nothing comes for a while.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		rec, err := client.Next(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Facility != kmsg.FacilityKernel || !strings.Contains(rec.Message, "NVRM:") || rec.Message == marker {
			t.Errorf("the relay handed out %+v", rec)
		}
	}
	for _, want := range []string{`"Relaying the NVIDIA driver's kernel-log records"`, `uid=65534`, `boot="` + boot + `"`} {
		if !strings.Contains(c.logged(), want) {
			t.Errorf("the relay's log lacks %s:\n%s", want, c.logged())
		}
	}
	if code := c.stop(t); code != 0 || !strings.Contains(c.logged(), `"Relay stopped"`) {
		t.Errorf("exit %d after SIGTERM, want 0 and a last line:\n%s", code, c.logged())
	}
}

// A relay that cannot open the log still listens, as nobody, and tells every client why.
func TestKmsgRelayThatCannotOpenTheLogSaysWhy(t *testing.T) {
	c := startRelayChild(t, "--kernel-log-path", "/nonexistent/kmsg")
	_, err := c.dial(t, "")
	if !errors.Is(err, kmsg.ErrRelayRefused) || !strings.Contains(err.Error(), "/nonexistent/kmsg: no such file or directory (no such file: ") {
		t.Errorf("DialRelay = %v, want the relay's refusal naming the missing file and the hint\n%s", err, c.logged())
	}
	if os.Geteuid() == 0 {
		for _, cred := range credentials(t, c.cmd.Process.Pid) {
			if !strings.HasPrefix(cred, "uid 65534 65534 65534 65534 ") {
				t.Errorf("a thread of the relay has %s, want nobody", cred)
			}
		}
	}
	if code := c.stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM:\n%s", code, c.logged())
	}
}

// Flags the relay cannot work with exit 2 naming the flag, before anything is opened.
func TestKmsgRelayBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--socket: an absolute path is required"},
		{[]string{"--socket", "relay.sock"}, "--socket: an absolute path is required"},
		{[]string{"--socket", "/" + strings.Repeat("s", 107)}, "at most 107 bytes, got 108"},
		{[]string{"--socket", "/run/r.sock", "--run-as-user", "0"}, "keeps no root"},
		{[]string{"--socket", "/run/r.sock", "--buffer-bytes", "0"}, "--buffer-bytes 0"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			code := cli.Execute(context.Background(), append([]string{"kmsg-relay"}, tc.args...), &bytes.Buffer{}, &stderr)
			if code != cli.ExitBadInput || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr.String(), cli.ExitBadInput, tc.want)
			}
		})
	}
}
