package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/nodegpu"
	"github.com/gpuhealth/gpuhealth/pkg/deviceplugin"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func newDevicePluginCommand() *cobra.Command {
	var (
		o    devicePluginOptions
		logs logOptions
	)
	cmd := &cobra.Command{
		Use:   "device-plugin [--backend nvml|sim] [--scenario FILE] [--config FILE] [--resource-name NAME] [--kubelet-socket-dir DIR] [--cdi] [--replicas N]",
		Short: "Serve this node's GPUs to the kubelet as a device plugin that marks sick GPUs Unhealthy and recovers them",
		Long: `device-plugin is a kubelet device plugin for nvidia.com/gpu built on the gpuhealth library. It
registers with the kubelet (and again whenever the kubelet restarts), lists every GPU by UUID, and
tells the kubelet at once when a GPU turns Unhealthy, and when it is Healthy again: a GPU that
recovers (after a reset, say) is schedulable again without restarting the plugin. Degraded GPUs
stay schedulable.

Allocate hands containers their GPUs as NVIDIA_VISIBLE_DEVICES=<UUID>,... or, with --cdi, as
the CDI devices nvidia.com/gpu=<UUID>. GetPreferredAllocation prefers Healthy over Degraded GPUs
and packs a request onto one NUMA node.

With --checkpoint FILE, faults that last until a GPU reset or a reboot survive a restart of the
plugin on the same boot.

With --replicas N, each GPU is time-sliced: advertised as N devices <UUID>::0..N-1 (the shape
NVIDIA's plugin uses) that share the GPU's health; a container gets each GPU once, and requests
go one at a time to the GPU with the fewest replicas in use (NVIDIA's "distributed" policy).`,
		Example: `  gpuhealth device-plugin
  gpuhealth device-plugin --cdi --checkpoint /var/lib/gpuhealth/device-plugin.json
  gpuhealth device-plugin --backend sim --scenario examples/scenario.yaml --kubelet-socket-dir /tmp/dp`,
		Args: cobra.NoArgs,
		RunE: logs.RunE(o.validate, func(ctx context.Context) error { return startDevicePlugin(ctx, &o) }),
	}
	o.addFlags(cmd.Flags())
	logs.addFlags(cmd.Flags())
	return cmd
}

// devicePluginOptions are the device plugin's flags.
type devicePluginOptions struct {
	source                                          nodegpu.BackendFlags
	configPath, resourceName, socketDir, checkpoint string
	kubeconfig, nodeName                            string
	cdi                                             bool
	replicas                                        int
	nvml                                            cmdutil.NVMLOptions
}

// addFlags registers the device plugin's flags on f.
func (o *devicePluginOptions) addFlags(f *pflag.FlagSet) {
	o.source.AddFlags(f)
	f.StringVar(&o.configPath, "config", "", "HealthConfig file (default: the built-in default profile)")
	f.StringVar(&o.resourceName, "resource-name", deviceplugin.DefaultResourceName, "extended resource to serve")
	f.StringVar(&o.socketDir, "kubelet-socket-dir", strings.TrimSuffix(deviceplugin.DefaultDir, "/"), "the kubelet's device-plugins directory (holds kubelet.sock)")
	f.BoolVar(&o.cdi, "cdi", false, "allocate GPUs as CDI devices nvidia.com/gpu=<UUID> instead of NVIDIA_VISIBLE_DEVICES")
	f.StringVar(&o.checkpoint, "checkpoint", "", "file keeping sticky faults across restarts on the same boot (default: none)")
	f.IntVar(&o.replicas, "replicas", 1, "time-slice each GPU into this many devices <UUID>::<n> (1: no sharing)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file, to watch this node's GPU operator pause labels (default: in-cluster configuration when in a cluster)")
	f.StringVar(&o.nodeName, "node-name", "", "this node's name, whose labels are watched (default $NODE_NAME)")
	o.nvml.AddFlags(f)
}

// validate refuses the plugin's own flags that cannot work, as bad input; the backend's are
// checked when it is opened.
func (o *devicePluginOptions) validate() error {
	if o.resourceName == "" || !strings.Contains(o.resourceName, "/") {
		return cmdutil.BadInput(fmt.Errorf("--resource-name: must be a domain-prefixed name such as nvidia.com/gpu, got %q", o.resourceName))
	}
	if o.socketDir == "" {
		return cmdutil.BadInput(errors.New("--kubelet-socket-dir: required"))
	}
	if err := deviceplugin.ValidateReplicas(o.replicas); err != nil {
		return cmdutil.BadInput(fmt.Errorf("--%w", err))
	}
	return nil
}

// startDevicePlugin opens the GPUs and serves them to the kubelet until ctx ends or a part
// fails; when only a new process can load the driver that came back, it re-executes this one.
func startDevicePlugin(ctx context.Context, o *devicePluginOptions) error {
	cfg, policy, err := cmdutil.LoadConfig(o.configPath)
	if err != nil {
		return err
	}
	envNode := os.Getenv("NODE_NAME")
	// In a DaemonSet, $NODE_NAME (the pod's node) names the simulated GPUs, as for the agent.
	opened, err := nodegpu.Open(ctx, nodegpu.Options{BackendFlags: o.source, Node: envNode, Config: cfg, NVML: &o.nvml})
	if err != nil {
		return err
	}
	run, cleanup := o.followDriver(ctx, cfg, opened, cmp.Or(o.nodeName, envNode))
	defer cleanup()
	kernelLog := nodegpu.OpenKernelLog(ctx, cfg, o.source.Backend, opened.Backend.Devices(), opened.BootID)
	defer kernelLog.Close()
	service := deviceplugin.ServiceOptions{CDI: o.cdi, Options: deviceplugin.Options{Replicas: o.replicas}}
	if o.source.Backend == "nvml" {
		service.NUMANode = deviceplugin.SysfsNUMA("/sys")
	}
	err = runDevicePlugin(ctx, devicePluginRun{
		backend: run, kernelLog: kernelLog, policy: policy, bootID: opened.BootID, checkpoint: o.checkpoint, service: service,
		plugin: deviceplugin.PluginOptions{ResourceName: o.resourceName, Dir: o.socketDir},
	})
	if !errors.Is(err, errReexec) {
		return err
	}
	kernelLog.Close()
	cleanup()
	klog.FromContext(ctx).Info("Re-executing the device plugin to load the driver that came back", "reason", err.Error())
	return cmdutil.Reexec()
}

// followDriver returns the backend the plugin runs and what closes it. Across the driver going
// away, or the GPU operator's pause on node, the NVML backend is replaced: it closes itself.
// The simulator's is run as it is.
func (o *devicePluginOptions) followDriver(ctx context.Context, cfg *config.HealthConfig, opened nodegpu.Opened, node string) (gpu.Backend, func()) {
	nb := nodegpu.NVMLBackend(opened.Backend)
	if nb == nil {
		return opened.Backend, opened.Close
	}
	logger := klog.FromContext(ctx)
	reattach := &reattachingBackend{
		current: nb, devices: nb.Devices(), clock: clock.RealClock{}, log: logger, initial: time.Second, max: 30 * time.Second,
		open: func() (nvmlSession, error) {
			b, err := o.nvml.Open(gpunvml.WithSamplePeriod(cfg.SampleEvery()), gpunvml.WithLogger(logger))
			if err != nil {
				return nil, err
			}
			return b, nil
		},
		changed: o.nvml.LibraryChanged,
		probe:   probeInChild(o.nvml.Args()),
	}
	pause, err := watchPauses(ctx, o.kubeconfig, node)
	if err != nil {
		logger.Info("Not watching the GPU operator's pause labels: NVML is released only when the driver itself says it is gone", "reason", err.Error())
	} else {
		reattach.pause = pause
	}
	return reattach, func() { _ = reattach.currentSession().Close() }
}

// devicePluginRun is what runDevicePlugin wires together.
type devicePluginRun struct {
	backend gpu.Backend
	// kernelLog is read beside the backend; nil means none.
	kernelLog  *kmsg.Companion
	policy     *health.Policy
	bootID     string
	checkpoint string
	// clock ticks the monitor and stamps the restore; nil means the wall clock.
	clock   health.Clock
	service deviceplugin.ServiceOptions
	plugin  deviceplugin.PluginOptions
}

// runDevicePlugin runs backend → monitor → device plugin until ctx ends or a part fails. Each
// part runs in a goroutine of one errgroup; the first failure stops the others.
func runDevicePlugin(ctx context.Context, r devicePluginRun) error {
	logger := klog.FromContext(ctx)
	if r.kernelLog == nil {
		r.kernelLog = kmsg.NewCompanion()
	}
	rt, err := health.NewRuntime(r.policy, r.backend.Devices(), health.RuntimeOptions{
		Clock: r.clock, CheckpointPath: r.checkpoint, BootID: r.bootID,
	})
	if err != nil {
		return err
	}
	if _, err := rt.Restore(); err != nil {
		// A damaged checkpoint must not keep the plugin down; start from what the GPUs say.
		logger.Error(err, "Ignoring the checkpoint", "path", r.checkpoint)
	} else if n := rt.RestoreNotes(); !n.Empty() {
		logger.Info("Warning: the checkpoint is of a newer release; restored what this one understands", "path", r.checkpoint,
			"version", n.Version, "unknownFields", n.UnknownFields, "skipped", n.Skipped, "skippedEntries", n.SkipReasons)
	}
	logger.Info("Starting the device plugin", "gpus", len(r.backend.Devices()), "resource", r.plugin.ResourceName, "cdi", r.service.CDI)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		err := rt.Run(gctx, func(ctx context.Context, m *health.Monitor) error {
			return r.kernelLog.Run(ctx, m, func(ctx context.Context) error { return r.backend.Run(ctx, r.kernelLog.BackendFeed(m, nil)) })
		})
		if err != nil {
			return fmt.Errorf("GPU backend: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		return deviceplugin.NewPlugin(deviceplugin.NewService(rt.Monitor(), r.service), r.plugin).Run(gctx)
	})
	err = g.Wait()
	if err == nil || ctx.Err() != nil {
		logger.Info("Device plugin stopped")
		return nil
	}
	return err
}

// watchPauses follows the GPU operator's pause labels on node (the device plugin lets go of NVML
// while they say so, as the agent does). The Node cache fills in the background: the plugin
// serves the kubelet whether or not the API server answers.
func watchPauses(ctx context.Context, kubeconfig, node string) (*nodegpu.OperatorPause, error) {
	if node == "" {
		return nil, errors.New("no node name (--node-name or $NODE_NAME)")
	}
	cfg, err := cmdutil.ComponentConfig(kubeconfig, "gpuhealth-device-plugin", 5, 10)
	if err != nil {
		return nil, err
	}
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	nodes := nodecache.New(client, node)
	pause, err := nodegpu.WatchOperatorPause(nodes)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := nodes.Start(ctx); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Watching the GPU operator's pause labels")
		}
	}()
	return pause, nil
}
