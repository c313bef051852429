// Command dra-driver is a small DRA kubelet plugin for simulated NVIDIA GPUs, built only on
// gpuhealth's public packages. It shows what a GPU DRA driver gets from embedding the library:
//
//   - health.Runtime runs the health library on the simulated GPUs of pkg/gpu/sim (ticks,
//     checkpoint, the backend's event stream): the driver writes no loop of its own for that;
//   - the driver publishes a ResourceSlice shaped like NVIDIA's gpu.nvidia.com driver, and
//     republishes it with pkg/dra's device taints whenever a GPU's health changes, so the
//     scheduler keeps new claims off sick GPUs;
//   - pkg/dra/healthstream answers the kubelet's DRA health stream (KEP-4680), so pod status
//     shows each allocated GPU Healthy or Unhealthy;
//   - claims are prepared as CDI devices that set NVIDIA_VISIBLE_DEVICES;
//   - GPUs drained with `gpuhealth drain` (the Node annotation of pkg/api/v1) count as Unhealthy.
//
// docs/embedding.md walks through it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/dra/healthstream"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// DefaultDriverName is the name NVIDIA's GPU driver registers under.
const DefaultDriverName = "gpu.nvidia.com"

// options are the command line.
type options struct {
	kubeconfig   string
	nodeName     string
	driverName   string
	registrarDir string
	pluginDir    string
	cdiDir       string
	scenario     string
	config       string
	checkpoint   string
	noExecute    bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := parseAndRun(ctx, os.Args[1:])
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dra-driver:", err)
		os.Exit(1)
	}
}

func parseAndRun(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dra-driver", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the in-cluster configuration)")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.StringVar(&o.driverName, "driver-name", DefaultDriverName, "DRA driver name")
	fs.StringVar(&o.registrarDir, "registrar-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	fs.StringVar(&o.pluginDir, "plugin-dir", "", "directory for the driver's socket (default "+kubeletplugin.KubeletPluginsDir+"/<driver-name>)")
	fs.StringVar(&o.cdiDir, "cdi-dir", "/var/run/cdi", "directory the container runtime reads CDI specs from")
	fs.StringVar(&o.scenario, "scenario", "", "scenario file of the simulated GPUs (required; see docs/scenario.md)")
	fs.StringVar(&o.config, "config", "", "HealthConfig file (default: the built-in default profile)")
	fs.StringVar(&o.checkpoint, "checkpoint", "", "file keeping sticky faults across restarts on the same boot (default: none)")
	fs.BoolVar(&o.noExecute, "no-execute", false, "taint GPUs whose fault asks for eviction NoExecute (evicts running pods) instead of NoSchedule")
	klog.InitFlags(fs) // -v and the other klog flags; main owns the process's logging
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case o.nodeName == "":
		return errors.New("--node-name: required (or set NODE_NAME)")
	case o.scenario == "":
		return errors.New("--scenario: required")
	}
	if o.pluginDir == "" {
		o.pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.driverName)
	}
	return run(ctx, o)
}

// run wires simulated GPUs → health.Runtime → the kubelet plugin, and runs them until ctx ends
// or a part fails.
func run(ctx context.Context, o options) error {
	logger := klog.Background().WithValues("driver", o.driverName, "node", o.nodeName)
	ctx = klog.NewContext(ctx, logger)
	// A fatal background error of the kubelet plugin helper (HandleError) ends everything.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)

	// The health library: a policy (which faults matter, what clears them) and a Runtime that
	// runs the simulated GPUs through it.
	cfg, policy, err := config.LoadPolicy(o.config)
	if err != nil {
		return err
	}
	sc, err := sim.LoadScenario(o.scenario)
	if err != nil {
		return err
	}
	backend := sim.New(sc, sim.Options{Clock: clock.RealClock{}, SampleInterval: cfg.SampleEvery(), Forever: true})
	rt, err := health.NewRuntime(policy, backend.Devices(), health.RuntimeOptions{
		CheckpointPath: o.checkpoint, BootID: backend.BootID(),
	})
	if err != nil {
		return err
	}
	if restored, err := rt.Restore(); err != nil {
		logger.Error(err, "Ignoring the checkpoint: starting from what the GPUs say")
	} else if restored {
		logger.Info("Restored sticky faults from the checkpoint", "path", o.checkpoint)
	}

	// The driver: its devices, CDI specs and health stream.
	gpus := newInventory(backend.Devices(), o.nodeName)
	d := &driver{
		name:      o.driverName,
		inventory: gpus,
		cdi:       cdiWriter{dir: o.cdiDir, vendor: cdiVendor(o.driverName)},
		health:    healthstream.NewHealthReporter(rt.Monitor(), gpus.deviceIDs(), healthstream.HealthOptions{}),
		fail:      fail,
	}
	if err := os.MkdirAll(o.cdiDir, 0o755); err != nil {
		return fmt.Errorf("CDI directory: %w", err)
	}
	if err := os.MkdirAll(o.pluginDir, 0o750); err != nil {
		return fmt.Errorf("plugin directory: %w", err)
	}
	client, err := newClient(o.kubeconfig)
	if err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(o.driverName),
		kubeletplugin.NodeName(o.nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(o.registrarDir),
		kubeletplugin.PluginDataDirectoryPath(o.pluginDir),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	logger.Info("Serving simulated GPUs", "gpus", len(gpus.byName), "scenario", o.scenario)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		// Ticks, checkpoints and the simulator's event stream, until gctx ends.
		return rt.Run(gctx, func(ctx context.Context, m *health.Monitor) error { return backend.Run(ctx, m) })
	})
	g.Go(func() error {
		return publishSlices(gctx, rt.Monitor(), helper, gpus, dra.TaintOptions{NoExecute: o.noExecute})
	})
	g.Go(func() error { return watchDrains(gctx, client, o.nodeName, rt.Monitor()) })
	err = g.Wait()
	if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	logger.Info("Stopped")
	return err
}

// newClient builds the client from a kubeconfig file, or from the in-cluster configuration.
func newClient(kubeconfig string) (kubernetes.Interface, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "gpuhealth-example-dra-driver"
	return kubernetes.NewForConfig(cfg)
}
