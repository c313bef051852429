package simdriver_test

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"

	"github.com/gpuhealth/gpuhealth/internal/simdriver"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The tests build the simulated libraries once (hack/sim-driver.sh, which needs gcc) and load
// them through gpuhealth's own NVML backend, that is through go-nvml's real cgo path. A process
// can load one libnvidia-ml.so.1 only (the dynamic loader keeps the first), so every consumer
// runs as a child process: this test binary again, in the mode $childEnv names.
const childEnv = "GPUHEALTH_SIMDRIVER_CHILD"

var libraryDir string

func TestMain(m *testing.M) {
	// The dcgmi Serve installs runs its binary as `sim-driver dcgmi ...`: in these tests, this
	// test binary, which then is the gpuhealth binary's dcgmi.
	if len(os.Args) > 2 && os.Args[1] == "sim-driver" && os.Args[2] == "dcgmi" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := simdriver.DCGMI(ctx, os.Args[3:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode, os.Getenv("GPUHEALTH_SIMDRIVER_ROOT")))
	}
	dir, err := os.MkdirTemp("", "simdriver-libs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command("hack/sim-driver.sh", dir)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "hack/sim-driver.sh: %v\n%s", err, out)
		os.Exit(1)
	}
	libraryDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	if publicDir != "" {
		_ = os.RemoveAll(publicDir)
	}
	os.Exit(code)
}

var profiles = []string{"470.256.02", "525.147.05", "535.261.03", "550.163.01"}

// served is a simulator serving a scenario on a fresh driver root.
type served struct {
	root       string
	registered chan int // the GPU index of every event registration
	stop       func()
}

// serve serves scenario with the driver profile version (set, when given, changes the options).
func serve(t *testing.T, scenario, version string, set ...func(*simdriver.Options)) *served {
	t.Helper()
	return serveOn(t, newRoot(t), scenario, version, set...)
}

// newRoot is a fresh driver root, removed at the end of the test. Its path is short: a Unix
// socket path has at most 107 bytes.
func newRoot(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "sd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	return root
}

// startSimulator starts a simulator child (serveChild's, changed as a test needs it) and waits
// until it serves.
func startSimulator(t *testing.T, cmd *exec.Cmd) *childProc {
	t.Helper()
	sd := startCommand(t, cmd)
	if l := <-sd.lines; l != "serving" {
		t.Fatalf("simulator: %q", l)
	}
	return sd
}

// serveChild is a simulator of fourGPUs on root in a child process ("serve" mode), with env
// added; it prints "serving" when it listens.
func serveChild(root string, env ...string) *exec.Cmd {
	return childCommand("serve", root, append([]string{"GPUHEALTH_SIMDRIVER_SCENARIO=apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\n" + fourGPUs,
		"GPUHEALTH_SIMDRIVER_LIBS=" + libraryDir}, env...)...)
}

func serveOn(t *testing.T, root, scenario, version string, set ...func(*simdriver.Options)) *served {
	t.Helper()
	sc, err := sim.ParseDriverScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\n" + scenario))
	if err != nil {
		t.Fatal(err)
	}
	s := &served{root: root, registered: make(chan int, 1024)}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	o := simdriver.Options{Scenario: sc, DriverRoot: root, Version: version, LibraryDir: libraryDir,
		Logger: testLogger(t), Ready: func() { close(ready) },
		OnRegister: func(_ uint32, gpu int, _ uint64) {
			select {
			case s.registered <- gpu:
			default:
			}
		}}
	for _, f := range set {
		f(&o)
	}
	go func() { done <- simdriver.Serve(ctx, o) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("Serve: %v", err)
	}
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(s.stop)
	return s
}

func testLogger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{})
}

// childProc is a consumer process: its stdout lines as they come, a wait for its end, and its
// stdin to close (a watching child stops then).
type childProc struct {
	lines      <-chan string
	wait       func() error
	closeStdin func()
	cmd        *exec.Cmd
}

// childCommand is this test binary as a consumer in mode on root.
func childCommand(mode, root string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode, "GPUHEALTH_SIMDRIVER_ROOT="+root), env...)
	return cmd
}

// startChild runs this test binary as a consumer in mode on root, and kills it at the end of the
// test.
func startChild(t *testing.T, mode, root string, env ...string) *childProc {
	t.Helper()
	return startCommand(t, childCommand(mode, root, env...))
}

// startCommand starts a child made by childCommand (changed as a test needs it), and kills it at
// the end of the test.
func startCommand(t *testing.T, cmd *exec.Cmd) *childProc {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe() // open until the test ends: a watching child stops when it closes
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			out <- sc.Text()
		}
		close(out)
	}()
	var once sync.Once
	var werr error
	wait := func() error {
		once.Do(func() {
			werr = cmd.Wait()
			if werr != nil {
				werr = fmt.Errorf("%w: %s", werr, stderr.String())
			}
		})
		return werr
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = wait()
	})
	return &childProc{lines: out, wait: wait, closeStdin: func() { _ = stdin.Close() }, cmd: cmd}
}

// stop closes a watching child's stdin and waits for it to end cleanly.
func (c *childProc) stop(t *testing.T) {
	t.Helper()
	c.closeStdin()
	for range c.lines {
	}
	if err := c.wait(); err != nil {
		t.Fatal(err)
	}
}

// child is a consumer process: it opens gpuhealth's NVML backend on the driver root.
func child(mode, root string) int {
	enc := json.NewEncoder(os.Stdout)
	switch mode {
	case "probe":
		b, err := gpunvml.OpenDriverRoot(root, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer b.Close()
		_ = enc.Encode(b.Probe())
		return 0
	case "watch":
		// Many start attempts: a test may kill the simulator before the event set is made, and
		// the next one may take a while to serve on a loaded machine.
		b, err := gpunvml.OpenDriverRoot(root, nil, gpunvml.WithSamplePeriod(time.Hour), gpunvml.WithEventWait(100*time.Millisecond),
			gpunvml.WithStartRetries(60, 100*time.Millisecond), gpunvml.WithWaitBackoff(100*time.Millisecond, time.Second))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer b.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		go func() { // the parent closes stdin to stop the child
			_, _ = io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
		if err := b.Run(ctx, printSink{enc}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if gone := b.DriverGone(); gone != nil {
				fmt.Printf("gone %d\n", int32(gone.Ret))
				return 3
			}
			return 1
		}
		return 0
	case "serve":
		sc, err := sim.ParseDriverScenario([]byte(os.Getenv("GPUHEALTH_SIMDRIVER_SCENARIO")))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if u := os.Getenv("GPUHEALTH_SIMDRIVER_UMASK"); u != "" {
			mask, err := strconv.ParseUint(u, 8, 32)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			syscall.Umask(int(mask))
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		err = simdriver.Serve(ctx, simdriver.Options{Scenario: sc, DriverRoot: root, LibraryDir: os.Getenv("GPUHEALTH_SIMDRIVER_LIBS"),
			Version: os.Getenv("GPUHEALTH_SIMDRIVER_VERSION"),
			Logger:  logr.Discard(), Ready: func() { fmt.Println("serving") }})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "equivalence":
		return equivalenceChild(root)
	case "inject":
		if err := simdriver.Inject(root, os.Getenv("GPUHEALTH_SIMDRIVER_EVENT")); err != nil {
			fmt.Printf("forbidden=%t %v\n", errors.Is(err, simdriver.ErrInjectForbidden), err)
			return 1
		}
		fmt.Println("injected")
		return 0
	case "retry":
		d := &gpunvml.DriverRoot{Root: root}
		said := ""
		for range 600 {
			b, err := d.Open()
			if err == nil {
				fmt.Println("open", len(b.Devices()))
				_ = b.Close()
				return 0
			}
			if said == "" {
				said = err.Error()
				fmt.Println("error", errors.Is(err, gpunvml.ErrDriverNotLoaded))
			}
			time.Sleep(50 * time.Millisecond)
		}
		return 1
	}
	fmt.Fprintln(os.Stderr, "unknown child mode", mode)
	return 2
}

type printSink struct{ enc *json.Encoder }

func (p printSink) Signal(s health.Signal) {
	if s.Kind != health.SignalSample {
		_ = p.enc.Encode(s)
	}
}
func (p printSink) Reboot(string, time.Time)    {}
func (p printSink) SetUnmonitored(string, bool) {}

const fourGPUs = "node: sd-node\ngpus: {count: 4}\nevents:\n  - {at: 0s, gpu: 1, temperatureC: 97}\n  - {at: 0s, gpu: 3, ecc: {uncorrectedVolatile: 2}}\n"

// Every profile's library exports exactly the functions of NVIDIA's library of that branch.
func TestExportsMatchTheRealBranches(t *testing.T) {
	for _, v := range profiles {
		t.Run(v, func(t *testing.T) {
			f, err := elf.Open(filepath.Join(libraryDir, v, "libnvidia-ml.so."+v))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			syms, err := f.DynamicSymbols()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range syms {
				if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
					got = append(got, s.Name)
				}
			}
			slices.Sort(got)
			data, err := os.ReadFile(filepath.Join("profiles", v+".txt"))
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, l := range strings.Split(string(data), "\n") {
				if l != "" && !strings.HasPrefix(l, "#") {
					want = append(want, l)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("exports differ from the real %s library:\n got %d: %v\nwant %d", v, len(got), got, len(want))
			}
			soname, _ := f.DynString(elf.DT_SONAME)
			if !slices.Equal(soname, []string{"libnvidia-ml.so.1"}) {
				t.Errorf("SONAME %v", soname)
			}
		})
	}
}

// gpuhealth's NVML backend, through go-nvml's real cgo path, sees the scenario's GPUs on every
// driver profile, and what each profile lacks is what the real branch lacks.
func TestBackendOnEveryProfile(t *testing.T) {
	for _, v := range profiles {
		t.Run(v, func(t *testing.T) {
			s := serve(t, fourGPUs, v)
			c := startChild(t, "probe", s.root)
			lines, wait := c.lines, c.wait
			var rep gpunvml.Report
			for l := range lines {
				if err := json.Unmarshal([]byte(l), &rep); err != nil {
					t.Fatalf("%v: %s", err, l)
				}
			}
			if err := wait(); err != nil {
				t.Fatal(err)
			}
			if rep.DriverVersion != v || len(rep.GPUs) != 4 {
				t.Fatalf("driver %q, %d GPUs; want %s, 4", rep.DriverVersion, len(rep.GPUs), v)
			}
			for i, g := range rep.GPUs {
				if g.Device.UUID != sim.GPUUUID("sd-node", i) || g.Device.PCIBusID != fmt.Sprintf("00000000:%02X:00.0", 0x10+i) || g.Device.Index != i ||
					g.Device.Serial != sim.DefaultSerial("sd-node", i) || g.Device.VBIOS != sim.DefaultVBIOS {
					t.Errorf("GPU %d: %+v", i, g.Device)
				}
				if !slices.Contains(g.Events, "xid") {
					t.Errorf("GPU %d events %v, want xid among them", i, g.Events)
				}
			}
			if tc := rep.GPUs[1].Readings.Temperature; tc == nil || tc.CurrentC != 97 || tc.SlowdownC != sim.SlowdownC || tc.ShutdownC != sim.ShutdownC {
				t.Errorf("GPU 1 temperature %+v, want 97 °C with the thresholds", tc)
			}
			if e := rep.GPUs[3].Readings.ECC; e == nil || e.Uncorrected != 2 {
				t.Errorf("GPU 3 ECC %+v, want 2 uncorrected", e)
			}
			if c := rep.GPUs[0].Readings.ClockEventReasons; c == nil {
				t.Errorf("clock event reasons not read (through ThrottleReasons before 535)")
			}
		})
	}
}

// One XID reaches every event set of every consumer at once, whenever they started; events before
// a registration are not replayed to it.
func TestEventsReachEveryConsumer(t *testing.T) {
	s := serve(t, fourGPUs, "")
	const consumers = 3
	var outs []<-chan string
	for range consumers {
		lines := startChild(t, "watch", s.root).lines
		outs = append(outs, lines)
	}
	registeredGPU2 := 0
	deadline := time.After(30 * time.Second)
	for registeredGPU2 < consumers {
		select {
		case gpu := <-s.registered:
			if gpu == 2 {
				registeredGPU2++
			}
		case <-deadline:
			t.Fatalf("only %d of %d consumers registered GPU 2", registeredGPU2, consumers)
		}
	}
	if err := simdriver.Inject(s.root, "{gpu: 2, xid: 79}"); err != nil {
		t.Fatal(err)
	}
	if err := simdriver.Inject(s.root, "{gpu: 0, xid: 94, repeat: 3}"); err != nil {
		t.Fatal(err)
	}
	for i, lines := range outs {
		var xids []string
		timeout := time.After(30 * time.Second)
		for len(xids) < 4 {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("consumer %d ended after %v", i, xids)
				}
				var sig health.Signal
				if err := json.Unmarshal([]byte(l), &sig); err != nil {
					t.Fatal(err)
				}
				if sig.Kind == health.SignalXID {
					xids = append(xids, fmt.Sprintf("%s/%d", sig.Device, sig.XID))
				}
			case <-timeout:
				t.Fatalf("consumer %d got %v, want 4 XIDs", i, xids)
			}
		}
		want := []string{sim.GPUUUID("sd-node", 2) + "/79", sim.GPUUUID("sd-node", 0) + "/94", sim.GPUUUID("sd-node", 0) + "/94", sim.GPUUUID("sd-node", 0) + "/94"}
		if !slices.Equal(xids, want) {
			t.Errorf("consumer %d got %v, want %v", i, xids, want)
		}
	}
}

// Stopped, the simulator is a driver that is not loaded; started again, one that came back, and
// a process that kept trying (as the agent does) opens it.
func TestDriverGoesAndComesBack(t *testing.T) {
	root := newRoot(t)
	sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n\ngpus: {count: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := simdriver.Install(root, "", libraryDir, ""); err != nil {
		t.Fatal(err)
	}
	c := startChild(t, "retry", root)
	lines, wait := c.lines, c.wait
	if l := <-lines; l != "error true" {
		t.Fatalf("without a simulator the child says %q, want the driver-not-loaded error", l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- simdriver.Serve(ctx, simdriver.Options{Scenario: sc, DriverRoot: root, LibraryDir: libraryDir, Logger: testLogger(t)})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if l := <-lines; l != "open 2" {
		t.Fatalf("once the simulator serves, the child says %q, want open 2", l)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

func TestInjectRefusesBadEvents(t *testing.T) {
	s := serve(t, fourGPUs, "")
	for _, ev := range []string{"{gpu: 7, xid: 79}", "{at: 1s, gpu: 1, xid: 79}", "not yaml: [", "{gpu: 1}", "{gpu: 1, xid: 79, ecc: {uncorrectedVolatile: 1}}",
		`{kmsg: "NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen off the bus"}`, "{reboot: true}", ""} {
		if err := simdriver.Inject(s.root, ev); !errors.Is(err, simdriver.ErrInjectRefused) {
			t.Errorf("Inject(%q) = %v, want a refusal", ev, err)
		}
	}
	if err := simdriver.Inject(filepath.Join(s.root, "nowhere"), "{gpu: 1, xid: 79}"); err == nil || errors.Is(err, simdriver.ErrInjectRefused) {
		t.Errorf("Inject without a simulator = %v, want an error that is not a refusal", err)
	}
}

func TestServeRefusesWhatADriverCannotServe(t *testing.T) {
	for name, events := range map[string]string{
		"kmsg":   `  - {at: 1s, kmsg: "NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen off the bus"}`,
		"reboot": "  - {at: 1s, reboot: true}",
	} {
		t.Run(name, func(t *testing.T) {
			sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n\ngpus: {count: 1}\nevents:\n" + events + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			err = simdriver.CheckScenario(sc)
			if err == nil || !strings.Contains(err.Error(), "line 6: "+name) {
				t.Errorf("CheckScenario = %v, want the line and the event named", err)
			}
		})
	}
}

// A second simulator on the same driver root is refused; one killed without cleaning up leaves a
// socket the next takes over.
func TestOneSimulatorPerDriverRoot(t *testing.T) {
	s := serve(t, fourGPUs, "")
	sc, _ := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n\ngpus: {count: 1}\n"))
	err := simdriver.Serve(context.Background(), simdriver.Options{Scenario: sc, DriverRoot: s.root, LibraryDir: libraryDir, Logger: logr.Discard()})
	if err == nil || !strings.Contains(err.Error(), "another simulator already serves") {
		t.Errorf("second Serve = %v", err)
	}
	s.stop()
	// A stale socket file, as SIGKILL leaves it.
	if err := os.WriteFile(simdriver.SocketPath(s.root), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	again := serveOn(t, s.root, fourGPUs, "")
	c := startChild(t, "probe", again.root)
	lines, wait := c.lines, c.wait
	for range lines {
	}
	if err := wait(); err != nil {
		t.Fatalf("after taking over the stale socket: %v", err)
	}
}

// The driver cannot be unloaded while a process holds NVML (as rmmod refuses a module in use);
// once it lets go, the unload goes through, nvmlInit answers DRIVER_NOT_LOADED, and a load
// brings the driver back.
func TestDriverUnloadAndLoad(t *testing.T) {
	s := serve(t, fourGPUs, "")
	holder := startChild(t, "watch", s.root)
	for gpu := range s.registered {
		if gpu == 3 {
			break // the holder has NVML open and its events registered
		}
	}
	err := simdriver.Inject(s.root, "{driver: unload}")
	if err == nil || errors.Is(err, simdriver.ErrInjectRefused) || !strings.Contains(err.Error(), "in use by 1 processes") {
		t.Fatalf("unload while held = %v, want refused as in use", err)
	}
	holder.stop(t)
	if err := simdriver.Inject(s.root, "{driver: unload}"); err != nil {
		t.Fatalf("unload once released: %v", err)
	}
	retry := startChild(t, "retry", s.root)
	lines, wait := retry.lines, retry.wait
	if l := <-lines; l != "error true" {
		t.Fatalf("after the unload the child says %q, want the driver-not-loaded error", l)
	}
	if err := simdriver.Inject(s.root, "{driver: load}"); err != nil {
		t.Fatal(err)
	}
	if l := <-lines; l != "open 4" {
		t.Fatalf("after the load the child says %q, want open 4", l)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// Readings only a driver can get wrong: a temperature out of any range for one read, a counter
// that reads lower once, and calls on a wedged GPU that hang.
// TestResetRefusedWhileHeld: a reset, injected or on the scenario's timeline, is served as
// nvidia-smi --gpu-reset serves it: refused while another process holds NVML, done once it let go.
func TestResetRefusedWhileHeld(t *testing.T) {
	s := serve(t, fourGPUs+"  - {at: 2s, gpu: 3, reset: true}\n  - {afterReset: 0s, gpu: 3, xid: 48}\n", "")
	holder := startChild(t, "watch", s.root)
	for gpu := range s.registered {
		if gpu == 3 {
			break
		}
	}
	err := simdriver.Inject(s.root, "{gpu: 3, reset: true}")
	if err == nil || errors.Is(err, simdriver.ErrInjectRefused) || !strings.Contains(err.Error(), "reset refused") {
		t.Fatalf("reset while held = %v, want refused as in use", err)
	}
	// The timeline's reset at 2s is refused too: its afterReset XID 48 never comes.
	deadline := time.After(4 * time.Second)
	for done := false; !done; {
		select {
		case l, ok := <-holder.lines:
			if !ok {
				t.Fatal("the holder ended early")
			}
			if strings.Contains(l, `"XID":48`) {
				t.Fatalf("an XID 48 after a refused reset: %s", l)
			}
		case <-deadline:
			done = true
		}
	}
	holder.stop(t)
	if err := simdriver.Inject(s.root, "{gpu: 1, reset: true}"); err != nil {
		t.Fatalf("reset once released: %v", err)
	}
	b := startChild(t, "probe", s.root)
	var report struct {
		GPUs []struct {
			Readings struct {
				Temperature *struct {
					CurrentC int64 `json:"currentC"`
				} `json:"temperature"`
			} `json:"readings"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(<-b.lines), &report); err != nil {
		t.Fatal(err)
	}
	if err := b.wait(); err != nil {
		t.Fatal(err)
	}
	if len(report.GPUs) != 4 || report.GPUs[1].Readings.Temperature == nil || report.GPUs[1].Readings.Temperature.CurrentC != 35 {
		t.Fatalf("GPU 1 after its reset: %+v, want back at idle temperature", report.GPUs)
	}
}

// TestFabricState: an SXM GPU answers its NVLink fabric state; while Fabric Manager has not
// registered it the NVML backend watches none of its links, and once it has, all of them. A
// driver without the call (470) has its links read at once.
func TestFabricState(t *testing.T) {
	const sc = "node: sd-node\ngpus: {count: 2}\nevents:\n  - {at: 0s, gpu: 0, fabric: inProgress}\n  - {at: 1h, gpu: 0, nvlink: {link: 3, down: true}}\n"
	type probed struct {
		GPUs []struct {
			Readings struct {
				NVLinks       []json.RawMessage `json:"nvlinks"`
				FabricPending bool              `json:"nvlinkFabricPending"`
				Unsupported   []string          `json:"unsupported"`
			} `json:"readings"`
		} `json:"gpus"`
	}
	probe := func(t *testing.T, root string) probed {
		t.Helper()
		c := startChild(t, "probe", root)
		var p probed
		if err := json.Unmarshal([]byte(<-c.lines), &p); err != nil {
			t.Fatal(err)
		}
		if err := c.wait(); err != nil {
			t.Fatal(err)
		}
		if len(p.GPUs) != 2 {
			t.Fatalf("%d GPUs", len(p.GPUs))
		}
		if len(p.GPUs[1].Readings.NVLinks) != 0 || !slices.Contains(p.GPUs[1].Readings.Unsupported, "nvlink") {
			t.Errorf("GPU 1, without NVLink: %+v", p.GPUs[1].Readings)
		}
		return p
	}
	t.Run("550", func(t *testing.T) {
		s := serve(t, sc, "550")
		if p := probe(t, s.root); !p.GPUs[0].Readings.FabricPending || len(p.GPUs[0].Readings.NVLinks) != 0 {
			t.Errorf("GPU 0 while its fabric registration is in progress: %+v", p.GPUs[0].Readings)
		}
		if err := simdriver.Inject(s.root, "{gpu: 0, fabric: completed}"); err != nil {
			t.Fatal(err)
		}
		if p := probe(t, s.root); p.GPUs[0].Readings.FabricPending || len(p.GPUs[0].Readings.NVLinks) != 18 {
			t.Errorf("GPU 0 once registered: pending %t, %d links, want 18", p.GPUs[0].Readings.FabricPending, len(p.GPUs[0].Readings.NVLinks))
		}
	})
	t.Run("470", func(t *testing.T) {
		s := serve(t, sc, "470")
		if p := probe(t, s.root); p.GPUs[0].Readings.FabricPending || len(p.GPUs[0].Readings.NVLinks) != 18 {
			t.Errorf("GPU 0 on a driver without the fabric call: pending %t, %d links, want 18", p.GPUs[0].Readings.FabricPending, len(p.GPUs[0].Readings.NVLinks))
		}
	})
}

func TestDriverGlitches(t *testing.T) {
	s := serve(t, "node: sd-node\ngpus: {count: 4}\nevents:\n  - {at: 0s, gpu: 1, outOfRange: temperature}\n  - {at: 0s, gpu: 2, hang: 2s}\n", "")
	start := time.Now()
	c := startChild(t, "probe", s.root)
	lines, wait := c.lines, c.wait
	var rep gpunvml.Report
	for l := range lines {
		if err := json.Unmarshal([]byte(l), &rep); err != nil {
			t.Fatal(err)
		}
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("the probe took %v: calls on GPU 2 did not hang for 2 s", took)
	}
	if len(rep.GPUs) != 4 {
		t.Fatalf("%d GPUs", len(rep.GPUs))
	}
	got := rep.GPUs[1].Readings
	if got.Temperature != nil && got.Temperature.CurrentC == 35 {
		t.Errorf("GPU 1's first temperature read is the idle 35 °C, want the out-of-range glitch: %+v", got)
	}
	t.Logf("GPU 1 after an out-of-range temperature: temperature %+v, errors %v", got.Temperature, got.Errors)
}

// A simulator killed with SIGKILL under a watching consumer: the consumer does not crash (its
// calls answer errors while no simulator serves), the next simulator takes over the socket the
// killed one left, and the consumer, which never restarted, gets the XIDs injected there.
func TestSimulatorKilledUnderAConsumer(t *testing.T) {
	root := newRoot(t)
	first := startSimulator(t, serveChild(root))
	consumer := startChild(t, "watch", root)
	<-consumer.lines // the first sampling round: the consumer has NVML open
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.wait()
	if _, err := os.Stat(simdriver.SocketPath(root)); err != nil {
		t.Fatalf("the killed simulator's socket: %v (SIGKILL leaves it)", err)
	}
	// The consumer's calls fail for a second; it must not end.
	for quiet := time.After(time.Second); ; {
		select {
		case _, ok := <-consumer.lines:
			if !ok {
				t.Fatalf("the consumer ended when its simulator was killed: %v", consumer.wait())
			}
			continue
		case <-quiet:
		}
		break
	}
	startSimulator(t, serveChild(root))
	// The consumer makes its event set anew on the new simulator (with backoff); inject until it
	// reports the XID.
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case l, ok := <-consumer.lines:
			if !ok {
				t.Fatal("the consumer ended")
			}
			var sig health.Signal
			if json.Unmarshal([]byte(l), &sig) == nil && sig.Kind == health.SignalXID && sig.XID == 79 {
				consumer.stop(t)
				return
			}
		case <-tick.C:
			if err := simdriver.Inject(root, "{gpu: 2, xid: 79}"); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("the consumer never got an XID from the second simulator")
		}
	}
}

// A driver upgraded under a consumer that kept NVML open (the simulator killed, another driver
// version served in its place): the kernel module refuses the old library
// (LIB_RM_VERSION_MISMATCH), and the backend's Run ends with a *DriverGoneError instead of
// retrying forever, so that its process can start again on the new library.
func TestDriverUpgradedUnderAConsumer(t *testing.T) {
	root := newRoot(t)
	first := startSimulator(t, serveChild(root, "GPUHEALTH_SIMDRIVER_VERSION=535"))
	consumer := startChild(t, "watch", root)
	<-consumer.lines // the first sampling round: the consumer has NVML open
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.wait()
	startSimulator(t, serveChild(root, "GPUHEALTH_SIMDRIVER_VERSION=550"))
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-consumer.lines:
			if !ok {
				t.Fatalf("the consumer ended without saying the driver went away: %v", consumer.wait())
			}
			if !strings.HasPrefix(l, "gone ") {
				continue
			}
			if l != fmt.Sprintf("gone %d", retLibRMVersionMismatch) {
				t.Errorf("the consumer says %q, want gone %d (LIB_RM_VERSION_MISMATCH)", l, retLibRMVersionMismatch)
			}
			var exit *exec.ExitError
			if err := consumer.wait(); !errors.As(err, &exit) || exit.ExitCode() != 3 {
				t.Errorf("the consumer ended with %v, want exit 3", err)
			}
			return
		case <-deadline:
			t.Fatal("the consumer never noticed the driver of another version")
		}
	}
}

// retLibRMVersionMismatch is NVML_ERROR_LIB_RM_VERSION_MISMATCH (nvml.h).
const retLibRMVersionMismatch = 18

// TestDeviceNodes: the driver root has the NVIDIA device nodes consumers stat, character devices
// of major 195 (minor i for GPU i, 255 for nvidiactl), where the test may create device nodes.
func TestDeviceNodes(t *testing.T) {
	probe := filepath.Join(t.TempDir(), "probe")
	if err := unix.Mknod(probe, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("this test cannot create device nodes (%v), nor can the simulator here", err)
	}
	s := serve(t, "node: n\ngpus: {count: 3}\n", "")
	want := map[string]uint32{"dev/nvidiactl": 255, "dev/nvidia0": 0, "dev/nvidia1": 1, "dev/nvidia2": 2}
	if got := simdriver.DeviceNodes(3); len(got) != len(want) {
		t.Fatalf("DeviceNodes(3) = %v", got)
	}
	for _, rel := range simdriver.DeviceNodes(3) {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(s.root, rel), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 195 || unix.Minor(st.Rdev) != want[rel] {
			t.Errorf("%s: mode %o, %d:%d, want a character device 195:%d", rel, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), want[rel])
		}
	}
}

// TestEarlyWarnings: the simulated driver answers the early-warning readings from its scenario
// state, and gpuhealth's NVML backend reads them through go-nvml's real cgo path, with what each
// profile's library has: the fabric health mask through nvmlDeviceGetGpuFabricInfoV (550 only;
// 525 and 535 have the plain call), the SRAM ECC status from 535, the histogram, the PCIe link and
// the NVLink recovery counts on every profile. A glitch of the driver is not believed.
func TestEarlyWarnings(t *testing.T) {
	const sc = "node: sd-node\ngpus: {count: 6}\nevents:\n" +
		"  - {at: 0s, gpu: 0, fabric: {state: completed, status: 999, health: [degradedBandwidth, routeRecovery]}}\n" +
		"  - {at: 0s, gpu: 1, rowRemapHistogram: {low: 2, none: 1}}\n" +
		"  - {at: 0s, gpu: 2, sramThresholdExceeded: true}\n" +
		"  - {at: 0s, gpu: 3, pcieLink: {gen: 4, width: 8}}\n" +
		"  - {at: 0s, gpu: 4, nvlinkRecoveries: {link: 3, successful: 10, failed: 2}}\n" +
		"  - {at: 0s, gpu: 5, outOfRange: pcieLink}\n" +
		"  - {at: 0s, gpu: 5, outOfRange: rowRemapHistogram}\n"
	for _, v := range []string{"470", "525", "535", "550"} {
		t.Run(v, func(t *testing.T) {
			s := serve(t, sc, v)
			c := startChild(t, "probe", s.root)
			var rep gpunvml.Report
			if err := json.Unmarshal([]byte(<-c.lines), &rep); err != nil {
				t.Fatal(err)
			}
			if err := c.wait(); err != nil {
				t.Fatal(err)
			}
			if len(rep.GPUs) != 6 {
				t.Fatalf("%d GPUs", len(rep.GPUs))
			}
			r := func(i int) gpunvml.Readings { return rep.GPUs[i].Readings }

			f := r(0).Fabric
			switch v {
			case "470":
				if f != nil || !strings.Contains(rep.GPUs[0].Unmonitored[gpunvml.ReadingFabric], "nvmlDeviceGetGpuFabricInfo") {
					t.Errorf("GPU 0 fabric %+v, unmonitored %v: want none on a driver without the call", f, rep.GPUs[0].Unmonitored)
				}
			case "550":
				if f == nil || f.State != 3 || f.Status != 999 || f.HealthMask == nil || !f.DegradedBandwidth || !f.RouteRecovery || f.RouteUnhealthy || f.AccessTimeoutRecovery {
					t.Errorf("GPU 0 fabric %+v, want completed with status 999, degraded bandwidth and a route recovery (the versioned call)", f)
				}
			default:
				if f == nil || f.State != 3 || f.Status != 999 || f.HealthMask != nil || f.DegradedBandwidth {
					t.Errorf("GPU 0 fabric %+v, want completed with status 999 and no health mask (the plain call)", f)
				}
			}
			if v != "470" && !slices.Contains(r(1).Unsupported, gpunvml.ReadingFabric) {
				t.Errorf("GPU 1, outside a fabric: unsupported %v, want fabric among them", r(1).Unsupported)
			}

			if h := r(1).RowRemapHistogram; h == nil || h.Low != 2 || h.None != 1 || h.Max != sim.RemapBanks-3 {
				t.Errorf("GPU 1 histogram %+v, want 2 low, 1 none, the rest max", h)
			}
			sram := r(2).SRAM
			if v == "470" || v == "525" {
				if sram != nil || rep.GPUs[2].Unmonitored[gpunvml.ReadingSRAM] == "" {
					t.Errorf("GPU 2 SRAM %+v on a driver without the call, unmonitored %v", sram, rep.GPUs[2].Unmonitored)
				}
			} else if sram == nil || !sram.ThresholdExceeded || (r(0).SRAM != nil && r(0).SRAM.ThresholdExceeded) {
				t.Errorf("GPU 2 SRAM %+v, want the threshold exceeded (and GPU 0 not: %+v)", sram, r(0).SRAM)
			}
			if l := r(3).PCIeLink; l == nil || *l != (gpunvml.PCIeLinkReading{Gen: 4, MaxGen: sim.PCIeGen, Width: 8, MaxWidth: sim.PCIeWidth}) {
				t.Errorf("GPU 3 PCIe link %+v, want gen 4 x8 of gen 5 x16", l)
			}
			if l := r(0).PCIeLink; l == nil || l.Width != sim.PCIeWidth {
				t.Errorf("GPU 0 PCIe link %+v, want x16", l)
			}
			recov := r(4).NVLinkRecoveries
			if len(recov) != sim.MaxNVLinks || recov[3] != (gpunvml.NVLinkRecoveryReading{Link: 3, Successful: 10, Failed: 2}) || recov[0].Successful != 0 {
				t.Errorf("GPU 4 NVLink recoveries %+v, want every link's, link 3 with 10 and 2", recov)
			}
			if len(r(1).NVLinkRecoveries) != 0 || slices.Contains(r(1).Unsupported, gpunvml.ReadingNVLinkRecoveries) {
				t.Errorf("GPU 1, without NVLink: recoveries %+v, unsupported %v; want neither", r(1).NVLinkRecoveries, r(1).Unsupported)
			}
			g5 := r(5)
			if g5.PCIeLink != nil || g5.RowRemapHistogram != nil || len(g5.Errors) != 2 {
				t.Errorf("GPU 5 after two glitches: PCIe %+v, histogram %+v, errors %q; want neither believed", g5.PCIeLink, g5.RowRemapHistogram, g5.Errors)
			}
		})
	}
}
