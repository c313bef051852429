package simdriver_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/gpuhealth/gpuhealth/internal/simdriver"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Who may change the simulated GPUs (peer.go): the tests run children as other users and in pid
// namespaces of their own, as a test cluster's tenants run, which takes root.

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runs children as other users and in pid namespaces of their own: needs root (make unit runs as root in CI)")
	}
}

// stranger is how a child differs from the node's own root: another user, a pid namespace of its
// own (as a container's process has, root or not), or both.
type stranger struct {
	uid   uint32 // 0: root
	pidNS bool
}

// apply makes cmd run as s. Another user runs a copy of the program every user may run: go
// test's directory, and the cache the NVIDIA tools come from, are root's alone.
func (s stranger) apply(t *testing.T, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	attr := &syscall.SysProcAttr{}
	if s.uid != 0 {
		cmd.Path = publicCopy(t, cmd.Path)
		attr.Credential = &syscall.Credential{Uid: s.uid, Gid: s.uid}
	}
	if s.pidNS {
		attr.Cloneflags = syscall.CLONE_NEWPID
	}
	cmd.SysProcAttr = attr
	return cmd
}

// publicDir holds the copies publicCopy makes; TestMain removes it.
var (
	publicDir    string
	publicMu     sync.Mutex
	publicCopies = map[string]string{}
)

// publicCopy copies the program at path, once, into a directory every user may enter.
func publicCopy(t *testing.T, path string) string {
	t.Helper()
	publicMu.Lock()
	defer publicMu.Unlock()
	if p, ok := publicCopies[path]; ok {
		return p
	}
	if publicDir == "" {
		dir, err := os.MkdirTemp("", "sd-public-")
		if err != nil {
			t.Fatal(err)
		}
		publicDir = dir
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(publicDir, fmt.Sprintf("%d-%s", len(publicCopies), filepath.Base(path)))
	if err := os.WriteFile(p, data, 0o755); err != nil {
		t.Fatal(err)
	}
	publicCopies[path] = p
	return p
}

// openToAll lets every user into the driver root (os.MkdirTemp makes it root's alone).
func openToAll(t *testing.T, root string) {
	t.Helper()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
}

// logLines records a simulator's log lines, and passes them on to t.Log.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) into(t *testing.T) func(*simdriver.Options) {
	return func(o *simdriver.Options) {
		o.Logger = funcr.New(func(prefix, args string) {
			t.Log(prefix, args)
			l.mu.Lock()
			defer l.mu.Unlock()
			l.lines = append(l.lines, args)
		}, funcr.Options{})
	}
}

// has says whether one line holds every part.
func (l *logLines) has(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// Only the node's own processes change what the simulated GPUs do: root, the simulator's own user
// and the users of InjectUIDs, in the simulator's pid namespace. Another user, and root in a pid
// namespace of its own (a container's root is uid 0 without a user namespace), are refused with
// an error that says why and a log line, and change nothing; every user still reads the GPUs.
func TestOnlyTheNodeChangesTheGPUs(t *testing.T) {
	requireRoot(t)
	var log logLines
	s := serve(t, "node: sd-node\ngpus: {count: 4}\n", "", log.into(t), func(o *simdriver.Options) { o.InjectUIDs = []uint32{65532} })
	openToAll(t, s.root)
	tests := []struct {
		name string
		as   stranger
		gpu  int
		want string // "": injected; else what the refusal says (and the log line)
	}{
		{"root on the node", stranger{}, 0, ""},
		{"a user of InjectUIDs on the node", stranger{uid: 65532}, 1, ""},
		{"another user on the node", stranger{uid: 65534}, 2, "(uid 65534): only root, the simulator's own uid 0 and --inject-uid [65532] may change what the simulated GPUs do"},
		{"root in a pid namespace of its own", stranger{pidNS: true}, 3, "(uid 0) runs in a pid namespace of its own (a container's)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			event := fmt.Sprintf("{gpu: %d, ecc: {uncorrectedVolatile: 1}}", tc.gpu)
			out, err := tc.as.apply(t, childCommand("inject", s.root, "GPUHEALTH_SIMDRIVER_EVENT="+event)).CombinedOutput()
			if tc.want == "" {
				if err != nil || string(out) != "injected\n" {
					t.Fatalf("inject: %v\n%s", err, out)
				}
				return
			}
			if err == nil || !strings.HasPrefix(string(out), "forbidden=true ") || !strings.Contains(string(out), tc.want) {
				t.Fatalf("inject: %v\n%s\nwant refused as forbidden, saying %q", err, out, tc.want)
			}
			if !log.has(`"what"="injection"`, tc.want) {
				t.Errorf("no log line of the refusal saying %q", tc.want)
			}
		})
	}
	// Another user reads the GPUs: the injections that went through, and none of the refused.
	out, err := stranger{uid: 65534}.apply(t, childCommand("probe", s.root)).Output()
	if err != nil {
		t.Fatalf("probe as another user: %v\n%s", err, out)
	}
	var rep gpunvml.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var got []int64
	for _, g := range rep.GPUs {
		if e := g.Readings.ECC; e != nil {
			got = append(got, int64(e.Uncorrected))
		}
	}
	if fmt.Sprint(got) != "[1 1 0 0]" {
		t.Errorf("uncorrected errors of the GPUs %v, want [1 1 0 0]: injected on GPUs 0 and 1 only", got)
	}
}

// nvidia-smi --gpu-reset from another user, or from root in a pid namespace of its own, is refused
// as NVIDIA's driver refuses a reset to a user who is not root (NO_PERMISSION: nvidia-smi exits
// 4), and the GPU keeps its errors; nvidia-smi -L still lists the GPUs for them.
func TestNvidiaSMIResetOnlyFromTheNode(t *testing.T) {
	drivers := os.Getenv("GPUHEALTH_NVIDIA_DRIVERS")
	if drivers == "" {
		t.Skip("$GPUHEALTH_NVIDIA_DRIVERS is not set: run hack/nvidia-drivers.sh (make unit does)")
	}
	requireRoot(t)
	const v = "550.163.01"
	var log logLines
	s := serve(t, fourGPUs, v, log.into(t))
	openToAll(t, s.root)
	smi := func(as stranger, args ...string) (string, int) {
		cmd := as.apply(t, exec.Command(filepath.Join(drivers, v, "nvidia-smi"), args...))
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(s.root, "usr/lib/x86_64-linux-gnu"))
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	for _, tc := range []struct {
		name string
		as   stranger
	}{
		{"another user", stranger{uid: 65534}},
		{"root in a pid namespace of its own", stranger{pidNS: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out, code := smi(tc.as, "-L"); code != 0 || !strings.Contains(out, "GPU 3: ") {
				t.Errorf("nvidia-smi -L: exit %d\n%s", code, out)
			}
			if out, code := smi(tc.as, "--gpu-reset", "-i", "3"); code != 4 { // NVML_ERROR_NO_PERMISSION
				t.Errorf("nvidia-smi --gpu-reset: exit %d, want 4 (no permission)\n%s", code, out)
			}
		})
	}
	out, _ := smi(stranger{}, "--query-gpu=ecc.errors.uncorrected.volatile.total", "--format=csv,noheader", "-i", "3")
	if got := strings.TrimSpace(out); got != "2" {
		t.Errorf("GPU 3 uncorrected after the refused resets: %q, want 2", got)
	}
	if !log.has(`"what"="GPU reset"`, "(uid 65534): only root and the simulator's own uid 0 may") || !log.has(`"what"="GPU reset"`, "runs in a pid namespace of its own") {
		t.Error("no log line of each refused reset")
	}
}

// A process is who the kernel says it is, not the pid its HELLO gives: a process that says it is
// a consumer cannot free that consumer's event sets, and the consumer keeps getting its XIDs.
func TestHelloPIDIsNotTrusted(t *testing.T) {
	v := profiles[len(profiles)-1]
	s := serve(t, fourGPUs, v)
	victim := startChild(t, "watch", s.root)
	for gpu := range s.registered {
		if gpu == 3 {
			break
		}
	}
	freed, err := simdriver.FreeEventSetsAs(s.root, v, uint32(victim.cmd.Process.Pid), 64)
	if err != nil {
		t.Fatal(err)
	}
	if freed != 0 {
		t.Fatalf("a process that said it was the consumer (pid %d) freed %d of its event sets", victim.cmd.Process.Pid, freed)
	}
	if err := simdriver.Inject(s.root, "{gpu: 2, xid: 79}"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.After(30 * time.Second); ; {
		select {
		case l, ok := <-victim.lines:
			if !ok {
				t.Fatalf("the consumer ended: %v", victim.wait())
			}
			var sig health.Signal
			if json.Unmarshal([]byte(l), &sig) == nil && sig.Kind == health.SignalXID {
				if sig.XID != 79 || sig.Device != sim.GPUUUID("sd-node", 2) {
					t.Fatalf("the consumer got %s", l)
				}
				victim.stop(t)
				return
			}
		case <-deadline:
			t.Fatal("the consumer never got the XID 79")
		}
	}
}

// The socket's mode is SocketMode, whatever the simulator's umask: NVML consumers run as any
// user.
func TestSocketModeWhateverTheUmask(t *testing.T) {
	root := newRoot(t)
	startSimulator(t, serveChild(root, "GPUHEALTH_SIMDRIVER_UMASK=077"))
	fi, err := os.Stat(simdriver.SocketPath(root))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != os.ModeSocket|simdriver.SocketMode {
		t.Errorf("socket mode %v, want %v", fi.Mode(), os.ModeSocket|simdriver.SocketMode)
	}
}

// A simulator in a pid namespace of its own (a pod's) cannot see the processes outside it: they
// read the GPUs, and none of them may change what the GPUs do, root or not.
func TestSimulatorInAPIDNamespaceOfItsOwn(t *testing.T) {
	requireRoot(t)
	root := newRoot(t)
	startSimulator(t, stranger{pidNS: true}.apply(t, serveChild(root)))
	probe := startChild(t, "probe", root)
	var rep gpunvml.Report
	if err := json.Unmarshal([]byte(<-probe.lines), &rep); err != nil || len(rep.GPUs) != 4 {
		t.Fatalf("probe from outside the simulator's pid namespace: %d GPUs, %v", len(rep.GPUs), err)
	}
	if err := probe.wait(); err != nil {
		t.Fatal(err)
	}
	err := simdriver.Inject(root, "{gpu: 1, xid: 79}")
	if !errors.Is(err, simdriver.ErrInjectForbidden) || !strings.Contains(err.Error(), "runs in a pid namespace the simulator cannot see") {
		t.Errorf("inject from outside the simulator's pid namespace = %v, want forbidden", err)
	}
}
