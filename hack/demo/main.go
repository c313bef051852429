// Command demo tells gpuhealth's story on a real, local cluster: `make demo`.
//
// It starts etcd, kube-apiserver, kube-scheduler (with `gpuhealth extender` configured) and
// kube-controller-manager on 127.0.0.1, and three real kubelet nodes (v1.37.2, fake CRI runtime,
// in the harness's node network) with 8 simulated GPUs each. On every node `gpuhealth
// device-plugin` registers with the real kubelet (so nvidia.com/gpu allocatable is the kubelet's
// own count of healthy GPUs) and a DRA kubelet plugin serves the gpu.nvidia.com ResourceSlices;
// a real `gpuhealth agent` per node reports health on every path. It replays
// examples/demo-scenario.yaml on the first node (a GPU falls off the bus, another overheats and
// recovers), drains a GPU of the second node as an operator would, submits pods through both
// scheduler paths (DRA claims and nvidia.com/gpu requests), and prints what happens: the status
// table as it changes, the kubelets' allocatable, where each pod landed and why, and which pods
// the kubelets run. Everything it started is stopped at the end, also on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

const (
	gpusPerNode = 8
	namespace   = "demo"
	waitLimit   = 90 * time.Second
)

var nodes = []string{"demo-node-0", "demo-node-1", "demo-node-2"}

// The GPU the demo repairs, and the one beside it that a reset does not cure: a fault only an
// active test finds (NVSentinel #695), which its validation catches.
const (
	repairNode = "demo-node-2"
	repairGPU  = 7
	latentGPU  = 6
)

func main() {
	bin := flag.String("gpuhealth", "bin/gpuhealth", "the gpuhealth binary")
	scenario := flag.String("scenario", "examples/demo-scenario.yaml", "scenario replayed on "+nodes[0])
	backend := flag.String("backend", "sim", "sim: the agents and device plugins simulate their GPUs; nvml: they read a simulated NVIDIA driver per node (gpuhealth sim-driver) through NVML, as in production")
	flag.Parse()
	if *backend != "sim" && *backend != "nvml" {
		fmt.Fprintf(os.Stderr, "demo: --backend must be sim or nvml, got %q\n", *backend)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *bin, *scenario, *backend == "nvml")
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// story prints numbered chapters.
type story struct {
	out     io.Writer
	start   time.Time
	chapter int
}

func (s *story) say(format string, args ...any) {
	fmt.Fprintf(s.out, "[%5.1fs] %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

func (s *story) heading(title string) {
	s.chapter++
	fmt.Fprintf(s.out, "\n=== %d. %s\n", s.chapter, title)
}

// demo is one run of the story: the cluster, the processes it started, and what the later
// sections read of the earlier ones.
type demo struct {
	ctx          context.Context
	st           *story
	bin          string
	scenarioPath string
	onDriver     bool
	c            *controlplane.Cluster
	admin        kubernetes.Interface
	kubeconfig   string
	logDir       string
	extenderAddr string
	kubeletNodes []*controlplane.KubeletNode
	draPlugins   []*controlplane.DRAPlugin
	procs        []*exec.Cmd
	started      map[string]*exec.Cmd
	// driverRoots maps a node to its simulated driver's root (--backend nvml); devicePlugins to
	// its device plugin's arguments.
	driverRoots   map[string]string
	devicePlugins map[string][]string
}

func run(ctx context.Context, bin, scenarioPath string, onDriver bool) error {
	d := &demo{ctx: ctx, st: &story{out: os.Stdout, start: time.Now()}, scenarioPath: scenarioPath, onDriver: onDriver,
		started: map[string]*exec.Cmd{}, driverRoots: map[string]string{}, devicePlugins: map[string][]string{}}
	var err error
	if d.bin, err = filepath.Abs(bin); err != nil {
		return err
	}
	sc, err := sim.LoadScenario(scenarioPath)
	if err != nil {
		return err
	}
	if sc.Node != nodes[0] {
		return fmt.Errorf("%s: node must be %s", scenarioPath, nodes[0])
	}
	if err := d.controlPlane(); err != nil {
		return err
	}
	defer d.stop()
	for _, section := range []func() error{d.gpuNodes, d.components, d.faults, d.repair, d.drain, d.work, d.coolDown} {
		if err := section(); err != nil {
			return err
		}
	}
	d.st.heading("The end")
	return nil
}

// controlPlane starts etcd, kube-apiserver, kube-scheduler (with the extender) and
// kube-controller-manager.
func (d *demo) controlPlane() error {
	ctx, st := d.ctx, d.st
	st.heading("A local control plane")
	st.say("finding or building etcd and Kubernetes %s (the first run builds them: about 10 minutes)", controlplane.KubernetesVersion)
	binDir, err := controlplane.FindBinDir(ctx)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	d.extenderAddr = ln.Addr().String()
	ln.Close()
	d.c, err = controlplane.Start(ctx, controlplane.Options{
		BinDir:      binDir,
		NodeNetwork: true,
		SchedulerConfigExtra: fmt.Sprintf(`extenders:
- urlPrefix: "http://%s"
  filterVerb: filter
  prioritizeVerb: prioritize
  weight: 5
  nodeCacheCapable: true
  httpTimeout: 10s
  managedResources:
  - name: nvidia.com/gpu
    ignoredByScheduler: false
`, d.extenderAddr),
	})
	if err != nil {
		return err
	}
	d.st.say("etcd, kube-apiserver, kube-scheduler and kube-controller-manager are up at %s", d.c.Host())
	d.admin, d.kubeconfig = d.c.Admin(), d.c.AdminKubeconfig()
	d.logDir, err = os.MkdirTemp("", "gpuhealth-demo-")
	return err
}

// stop stops every process the demo started, newest first, and the cluster.
func (d *demo) stop() {
	for _, p := range slices.Backward(d.procs) {
		_ = p.Process.Signal(syscall.SIGTERM)
		_ = p.Wait()
	}
	for _, root := range d.driverRoots {
		_ = os.RemoveAll(root)
	}
	for _, p := range d.draPlugins {
		p.Stop()
	}
	_ = d.c.Stop()
	d.st.say("stopped every process the demo started")
}

// start starts gpuhealth with args as the process name, its output in the log directory.
func (d *demo) start(name string, args ...string) error {
	logFile, err := os.OpenFile(filepath.Join(d.logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(d.bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	d.procs = append(d.procs, cmd)
	d.started[name] = cmd
	return nil
}

// status runs gpuhealth status with args, to the demo's output.
func (d *demo) status(args ...string) error {
	cmd := exec.CommandContext(d.ctx, d.bin, append([]string{"status", "--kubeconfig", d.kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}
