package validation

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Placeholders replaced in every argument of a Command.
const (
	PlaceholderUUID     = "{uuid}"
	PlaceholderIndex    = "{index}" // the DCGM id Run judges unless {dcgmID} is used
	PlaceholderPCIBusID = "{pciBusID}"
	PlaceholderNode     = "{node}"
	// PlaceholderDCGMID is DCGM's id of the GPU, found by its UUID in `dcgmi discovery -l` run
	// just before (same program, same --host): DCGM's ids need not be NVML's indexes (see the
	// package documentation). A GPU discovery does not list gives no verdict.
	PlaceholderDCGMID = "{dcgmID}"
)

// Command runs a validation command for one GPU.
type Command struct {
	// Argv is the program and its arguments; the placeholders are replaced in every argument.
	Argv   []string
	Format Format
	// Timeout kills the command (its whole process group) when it runs longer; the verdict is
	// then Error "timed out after ...". Zero means no limit but the context's.
	Timeout time.Duration
	// Dir is the working directory; empty: the agent's.
	Dir string
	// Env is the command's whole environment, as in exec.Cmd; empty: the agent's.
	Env []string
}

// maxStdout bounds the document kept; a level-2 dcgmi document is a few KiB, so more is not one.
const maxStdout = 4 << 20

// maxStderr bounds the stderr kept for messages; the rest is dropped, not an error.
const maxStderr = 64 << 10

// waitDelay bounds how long a killed command's stray children may keep its output open.
const waitDelay = 5 * time.Second

var (
	errTimedOut       = errors.New("timed out")
	errOutputTooLarge = errors.New("output too large")
)

// NamesGPU reports whether argv names the GPU in some argument: a command that does not would
// test something else and its pass would say nothing about this GPU.
func NamesGPU(argv []string) bool {
	for _, a := range argv {
		if strings.Contains(a, PlaceholderUUID) || strings.Contains(a, PlaceholderIndex) ||
			strings.Contains(a, PlaceholderPCIBusID) || strings.Contains(a, PlaceholderDCGMID) {
			return true
		}
	}
	return false
}

// Expand returns Argv with the placeholders replaced by dev's identity and the node's name
// ({dcgmID} by its index: Run maps it through DCGM's discovery).
func (c Command) Expand(dev health.Device, node string) []string {
	return c.expand(dev, node, dev.Index)
}

func (c Command) expand(dev health.Device, node string, dcgmID int) []string {
	r := strings.NewReplacer(
		PlaceholderUUID, dev.UUID,
		PlaceholderIndex, strconv.Itoa(dev.Index),
		PlaceholderPCIBusID, dev.PCIBusID,
		PlaceholderNode, node,
		PlaceholderDCGMID, strconv.Itoa(dcgmID),
	)
	out := make([]string, len(c.Argv))
	for i, a := range c.Argv {
		out[i] = r.Replace(a)
	}
	return out
}

// Run runs the command for dev on node and reads its verdict, judging the results of DCGM id
// dev.Index, or of the id DCGM's discovery gives dev's UUID when the command uses {dcgmID}
// (the timeout covers both runs). It never returns Passed unless a pass for this GPU was parsed; anything that keeps
// the command from reporting (a missing program, a timeout, a cancelled ctx, a signal, too much
// output) is an Error.
func (c Command) Run(ctx context.Context, dev health.Device, node string) Verdict {
	if len(c.Argv) == 0 || strings.TrimSpace(c.Argv[0]) == "" {
		return errorf("no validation command configured")
	}
	if dev.Index < 0 || dev.Missing {
		return errorf("GPU %s has no index (missing from the node)", dev.UUID)
	}
	if c.Timeout > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeoutCause(ctx, c.Timeout, errTimedOut)
		defer stop()
	}
	target := dev.Index
	if slices.ContainsFunc(c.Argv, func(a string) bool { return strings.Contains(a, PlaceholderDCGMID) }) {
		argv := c.discoveryArgv(dev, node)
		out, code, failed := c.exec(ctx, argv)
		if failed != nil {
			return errorf("mapping GPU %s to DCGM's id: %s", dev.UUID, failed.Message)
		}
		if code != 0 {
			return errorf("mapping GPU %s to DCGM's id: %s exited %d%s", dev.UUID, strings.Join(argv, " "), code, stderrTail(out))
		}
		ids, err := ParseDCGMDiscovery(out)
		id, ok := ids[strings.ToUpper(dev.UUID)]
		switch {
		case err != nil:
			return errorf("mapping GPU %s to DCGM's id: %v", dev.UUID, err)
		case !ok:
			return errorf("DCGM's host engine does not list GPU %s (%d GPUs listed): restart it if the GPU was replaced or re-attached", dev.UUID, len(ids))
		}
		target = id
	}
	argv := c.expand(dev, node, target)
	out, exitCode, failed := c.exec(ctx, argv)
	if failed != nil {
		return *failed
	}
	return Read(c.Format, out, exitCode, Target{DCGMID: target})
}

// discoveryArgv is `dcgmi discovery -l` on the host engine the command names (--host): the
// program is everything before "diag" (dcgmi may run through a loader: ld.so --library-path
// DIR dcgmi diag ...).
func (c Command) discoveryArgv(dev health.Device, node string) []string {
	argv := c.expand(dev, node, dev.Index)
	prog := argv[:1]
	if i := slices.Index(argv, "diag"); i > 0 {
		prog = argv[:i]
	}
	out := append(slices.Clone(prog), "discovery", "-l")
	for i, a := range argv {
		switch {
		case a == "--host" && i+1 < len(argv):
			out = append(out, a, argv[i+1])
		case strings.HasPrefix(a, "--host="):
			out = append(out, a)
		}
	}
	return out
}

// exec runs argv until it ends or ctx (which carries the timeout) is done, and returns its
// stdout followed by its stderr and its exit code, or the Error verdict of a run that could
// not report.
func (c Command) exec(ctx context.Context, argv []string) ([]byte, int, *Verdict) {
	fail := func(format string, args ...any) ([]byte, int, *Verdict) {
		v := errorf(format, args...)
		return nil, 0, &v
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	cmd := exec.CommandContext(runCtx, argv[0], argv[1:]...)
	cmd.Dir = c.Dir
	if len(c.Env) > 0 {
		cmd.Env = c.Env
	}
	stdout := &boundedBuffer{limit: maxStdout, overflow: func() { cancel(errOutputTooLarge) }}
	stderr := &boundedBuffer{limit: maxStderr}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	killGroup(cmd)
	cmd.WaitDelay = waitDelay

	start := time.Now()
	err := cmd.Run()
	if cause := context.Cause(runCtx); runCtx.Err() != nil {
		switch {
		case errors.Is(cause, errOutputTooLarge):
			return fail("output too large: more than %d bytes on stdout", maxStdout)
		case errors.Is(cause, errTimedOut):
			return fail("timed out after %s", c.Timeout)
		default:
			return fail("cancelled after %s: %v", time.Since(start).Round(time.Millisecond), cause)
		}
	}
	exitCode := 0
	if err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			return fail("%v", err)
		}
		if exitCode = exitErr.ExitCode(); exitCode < 0 {
			return fail("%s: %v%s", argv[0], exitErr, stderrTail(stderr.bytes()))
		}
	}
	// The document is on stdout; stderr follows it so that a message can quote dcgmi's complaint.
	out := stdout.bytes()
	if se := stderr.bytes(); len(se) > 0 {
		out = append(append(out, '\n'), se...)
	}
	return out, exitCode, nil
}

func stderrTail(b []byte) string {
	if s := excerpt(b, 300); s != "" {
		return ": " + s
	}
	return ""
}

// boundedBuffer keeps the first limit bytes written to it and calls overflow once when more
// arrive. exec.Cmd writes each stream from one goroutine; the mutex makes reads after Wait safe
// even when a stray child outlived it.
type boundedBuffer struct {
	mu       sync.Mutex
	buf      []byte
	limit    int
	over     bool
	overflow func()
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.limit - len(b.buf); room >= len(p) {
		b.buf = append(b.buf, p...)
	} else {
		b.buf = append(b.buf, p[:max(room, 0)]...)
		if !b.over && b.overflow != nil {
			b.overflow()
		}
		b.over = true
	}
	// Accept everything so the command is never blocked or failed by a short write.
	return len(p), nil
}

func (b *boundedBuffer) bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}
