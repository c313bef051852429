package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// kmsgRelaySocketMode lets the socket's owner (root, as the chart's agent runs) and group
// connect, no one else.
const kmsgRelaySocketMode = 0o660

// nobody is the user and group the relay becomes once the log is open.
const nobody = 65534

type kmsgRelayOptions struct {
	socket, path string
	uid, gid     int
	bufferBytes  int
}

// validate refuses the relay's flags that cannot work, as bad input.
func (o *kmsgRelayOptions) validate() error {
	switch {
	case o.socket == "" || !filepath.IsAbs(o.socket):
		return cmdutil.BadInput(fmt.Errorf("--socket: an absolute path is required, got %q", o.socket))
	case len(o.socket) > 107:
		return cmdutil.BadInput(fmt.Errorf("--socket: a Unix socket's path is at most 107 bytes, got %d", len(o.socket)))
	case o.uid <= 0 || o.gid <= 0:
		return cmdutil.BadInput(fmt.Errorf("--run-as-user %d, --run-as-group %d: the relay keeps no root, give another user and group", o.uid, o.gid))
	case o.bufferBytes <= 0:
		return cmdutil.BadInput(fmt.Errorf("--buffer-bytes %d: must be positive", o.bufferBytes))
	}
	return nil
}

func newKmsgRelayCommand() *cobra.Command {
	var o kmsgRelayOptions
	var logs logOptions
	cmd := &cobra.Command{
		Use:   "kmsg-relay --socket PATH",
		Short: "Read the kernel log for processes that may not, and hand them the NVIDIA driver's lines on a Unix socket",
		Long: `kmsg-relay opens /dev/kmsg, which in a container only a privileged one may, and hands the
records the NVIDIA driver logged (kernel facility, "NVRM:") to the processes that connect to
--socket: the agent and the device plugin read them with kernelLog.relaySocket
(docs/kernel-log.md), so that they need neither privileges nor CAP_SYSLOG. It is all the
chart's kmsg-relay container runs.

Right after opening the log and the socket, a relay started as root becomes --run-as-user and
--run-as-group (nobody) with no supplementary groups and no capabilities, in every thread, and
checks it did: what it reads afterwards it may read through the descriptor it holds, and it
can open nothing else the privileged container would let root open. It never reads from a
client. A relay that cannot open the log, or cannot drop its privileges, still listens and
tells every client why, so that the agent says so (gpuhealth_source_up{source="kmsg"} 0)
rather than finding no relay.

Each client gets every driver record held (from boot, up to --buffer-bytes, oldest dropped
first) and then each new one, one line per record with its sequence number; lines a process
wrote to the log are dropped and counted. It runs until SIGINT/SIGTERM and exits 1 when the log
fails to read (a restart reopens it).`,
		Example: `  gpuhealth kmsg-relay --socket /run/gpuhealth-kmsg/relay.sock`,
		Args:    cobra.NoArgs,
		RunE:    logs.RunE(o.validate, func(ctx context.Context) error { return runKmsgRelay(ctx, o) }),
	}
	f := cmd.Flags()
	f.StringVar(&o.socket, "socket", "", "the Unix socket to serve the driver's records on (created, mode 0660; a stale one is replaced)")
	f.StringVar(&o.path, "kernel-log-path", kmsg.DevKmsg, "the kernel log to read")
	f.IntVar(&o.uid, "run-as-user", nobody, "the user a relay started as root becomes once the log and the socket are open")
	f.IntVar(&o.gid, "run-as-group", nobody, "the group it becomes")
	f.IntVar(&o.bufferBytes, "buffer-bytes", kmsg.DefaultRelayBufferBytes, "how much of the driver's records to hold for clients that connect later")
	logs.addFlags(f)
	return cmd
}

// runKmsgRelay opens the log and the socket, lets go of root, and relays until ctx ends or the
// log fails to read.
func runKmsgRelay(ctx context.Context, o kmsgRelayOptions) error {
	logger := klog.FromContext(ctx)
	bootID, err := health.ReadBootID()
	if err != nil {
		logger.Info("Warning: no boot ID; clients cannot check the records are of their boot", "err", err.Error())
	}
	relay := kmsg.NewRelay(kmsg.RelayOptions{BootID: bootID, MaxBytes: o.bufferBytes})
	in, openErr := kmsg.Open(o.path)
	ln, err := listenRelaySocket(o.socket)
	if err != nil {
		if in != nil {
			_ = in.Close()
		}
		return err
	}
	if err := dropPrivileges(o.uid, o.gid); err != nil {
		// Fail closed: a log opened with privileges that could not be dropped is not read.
		if in != nil {
			_ = in.Close()
			in = nil
		}
		openErr = fmt.Errorf("refusing to relay the kernel log as %w", err)
	}
	if openErr != nil {
		reason := openErr.Error()
		if hint := kmsg.Hint(openErr); hint != "" {
			reason += " (" + hint + ")"
		}
		relay.Fail(reason)
		logger.Error(openErr, "The kernel log is not relayed; every client is told why", "path", o.path, "socket", o.socket)
	} else {
		logger.Info("Relaying the NVIDIA driver's kernel-log records", "path", o.path, "socket", o.socket, "boot", bootID,
			"uid", os.Getuid(), "gid", os.Getgid(), "bufferBytes", o.bufferBytes)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return relay.Serve(gctx, ln) })
	if in != nil {
		g.Go(func() error {
			defer in.Close()
			if err := relay.Read(gctx, in); err != nil {
				return fmt.Errorf("reading the kernel log %s: %w", o.path, err)
			}
			return nil
		})
	}
	err = g.Wait()
	s := relay.Stats()
	logger.Info("Relay stopped", "records", s.Records, "forwarded", s.Forwarded, "spoofed", s.Spoofed, "overruns", s.Overruns)
	return err
}

// listenRelaySocket listens on path, replacing a socket a relay left there before, and lets
// only the socket's owner and group connect.
func listenRelaySocket(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("the relay's socket directory: %w", err)
	}
	switch st, err := os.Lstat(path); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	case st.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("%s is there and is not a socket: not replacing it", path)
	default:
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing the stale socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("the relay's socket: %w", err)
	}
	if err := os.Chmod(path, kmsgRelaySocketMode); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("the relay's socket: %w", err)
	}
	return ln, nil
}

// dropPrivileges makes a process running as root uid:gid with no supplementary groups, which
// leaves it no capabilities (the kernel clears them when every uid leaves 0), and checks every
// thread did: Go applies these calls to all threads (through libc with cgo), and a thread
// that kept root would keep what the privileged container allows. A process not running as
// root has nothing to drop.
func dropPrivileges(uid, gid int) error {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("root: setgroups: %w", err)
	}
	if err := syscall.Setgid(gid); err != nil {
		return fmt.Errorf("root: setgid %d: %w", gid, err)
	}
	if err := syscall.Setuid(uid); err != nil {
		return fmt.Errorf("root: setuid %d: %w", uid, err)
	}
	return checkDropped(uid, gid)
}

// checkDropped reads every thread's credentials from /proc/self/task/*/status: every uid and
// gid as asked, no groups, no permitted, effective or ambient capability.
func checkDropped(uid, gid int) error {
	statuses, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		return fmt.Errorf("root: cannot read the threads' credentials: %w", err)
	}
	if len(statuses) == 0 {
		return errors.New("root: /proc/self/task lists no thread to check")
	}
	ids := func(id int) string { return strings.TrimSpace(strings.Repeat(strconv.Itoa(id)+" ", 4)) } // real, effective, saved, fs
	const none = "0000000000000000"
	want := map[string]string{"Uid": ids(uid), "Gid": ids(gid), "Groups": "", "CapPrm": none, "CapEff": none, "CapAmb": none}
	for _, path := range statuses {
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a thread that exited meanwhile
		}
		if err != nil {
			return fmt.Errorf("root: %w", err)
		}
		seen := 0
		for line := range strings.SplitSeq(string(data), "\n") {
			key, val, ok := strings.Cut(line, ":")
			w, asked := want[key]
			if !ok || !asked {
				continue
			}
			seen++
			if got := strings.Join(strings.Fields(val), " "); got != w {
				return fmt.Errorf("root: thread %s still has %s %s after dropping to %d:%d", filepath.Base(filepath.Dir(path)), key, got, uid, gid)
			}
		}
		if seen != len(want) {
			return fmt.Errorf("root: %s lacks some of %d credential lines", path, len(want))
		}
	}
	return nil
}
