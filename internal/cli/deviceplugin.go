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
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/cli/agentcmd"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/pkg/deviceplugin"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func newDevicePluginCommand() *cobra.Command {
	var (
		backend, scenarioPath, configPath, resourceName, socketDir, checkpoint string
		kubeconfig, nodeName                                                   string
		cdi                                                                    bool
		replicas                                                               int
		logs                                                                   logOptions
		nvmlOpts                                                               cmdutil.NVMLOptions
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, err := logs.context(cmd)
			if err != nil {
				return err
			}
			if resourceName == "" || !strings.Contains(resourceName, "/") {
				return cmdutil.BadInput(fmt.Errorf("--resource-name: must be a domain-prefixed name such as nvidia.com/gpu, got %q", resourceName))
			}
			if socketDir == "" {
				return cmdutil.BadInput(errors.New("--kubelet-socket-dir: required"))
			}
			if err := deviceplugin.ValidateReplicas(replicas); err != nil {
				return cmdutil.BadInput(fmt.Errorf("--%w", err))
			}
			cfg, policy, err := cmdutil.LoadConfig(configPath)
			if err != nil {
				return err
			}
			// In a DaemonSet, $NODE_NAME (the pod's node) names the simulated GPUs, as for the agent.
			be, bootID, cleanup, err := agentcmd.OpenBackend(ctx, backend, scenarioPath, os.Getenv("NODE_NAME"), cfg.SampleEvery(), &nvmlOpts,
				gpunvml.WithExpectedNVLinks(cfg.ExpectedNVLinks()))
			if err != nil {
				return err
			}
			var run gpu.Backend = be
			// Across the driver going away the NVML backend is replaced: it closes itself.
			if nb := agentcmd.NVMLBackend(be); nb != nil {
				logger := klog.FromContext(ctx)
				reattach := &reattachingBackend{
					current: nb, devices: nb.Devices(), clock: clock.RealClock{}, log: logger, initial: time.Second, max: 30 * time.Second,
					open: func() (nvmlSession, error) {
						b, err := nvmlOpts.Open(gpunvml.WithSamplePeriod(cfg.SampleEvery()), gpunvml.WithLogger(logger))
						if err != nil {
							return nil, err
						}
						return b, nil
					},
					changed: nvmlOpts.LibraryChanged,
					probe:   probeInChild(nvmlOpts.Args()),
				}
				run = reattach
				cleanup = func() { _ = reattach.currentSession().Close() }
				pause, err := watchPauses(ctx, kubeconfig, cmp.Or(nodeName, os.Getenv("NODE_NAME")))
				if err != nil {
					logger.Info("Not watching the GPU operator's pause labels: NVML is released only when the driver itself says it is gone", "reason", err.Error())
				} else {
					reattach.pause = pause
				}
			}
			defer cleanup()
			kernelLog := agentcmd.OpenKernelLog(ctx, cfg, backend, be.Devices(), bootID)
			defer kernelLog.Close()
			opts := deviceplugin.ServiceOptions{CDI: cdi, Options: deviceplugin.Options{Replicas: replicas}}
			if backend == "nvml" {
				opts.NUMANode = deviceplugin.SysfsNUMA("/sys")
			}
			err = runDevicePlugin(ctx, devicePluginRun{
				backend: run, kernelLog: kernelLog, policy: policy, bootID: bootID, checkpoint: checkpoint, service: opts,
				plugin: deviceplugin.PluginOptions{ResourceName: resourceName, Dir: socketDir},
			})
			if !errors.Is(err, errReexec) {
				return err
			}
			kernelLog.Close()
			cleanup()
			klog.FromContext(ctx).Info("Re-executing the device plugin to load the driver that came back", "reason", err.Error())
			return cmdutil.Reexec()
		},
	}
	f := cmd.Flags()
	f.StringVar(&backend, "backend", "nvml", "GPU backend: nvml or sim")
	f.StringVar(&scenarioPath, "scenario", "", "scenario file (with --backend sim)")
	f.StringVar(&configPath, "config", "", "HealthConfig file (default: the built-in default profile)")
	f.StringVar(&resourceName, "resource-name", deviceplugin.DefaultResourceName, "extended resource to serve")
	f.StringVar(&socketDir, "kubelet-socket-dir", strings.TrimSuffix(deviceplugin.DefaultDir, "/"), "the kubelet's device-plugins directory (holds kubelet.sock)")
	f.BoolVar(&cdi, "cdi", false, "allocate GPUs as CDI devices nvidia.com/gpu=<UUID> instead of NVIDIA_VISIBLE_DEVICES")
	f.StringVar(&checkpoint, "checkpoint", "", "file keeping sticky faults across restarts on the same boot (default: none)")
	f.IntVar(&replicas, "replicas", 1, "time-slice each GPU into this many devices <UUID>::<n> (1: no sharing)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file, to watch this node's GPU operator pause labels (default: in-cluster configuration when in a cluster)")
	f.StringVar(&nodeName, "node-name", "", "this node's name, whose labels are watched (default $NODE_NAME)")
	nvmlOpts.AddFlags(f)
	logs.addFlags(f)
	return cmd
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
func watchPauses(ctx context.Context, kubeconfig, node string) (*agentcmd.OperatorPause, error) {
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
	pause, err := agentcmd.WatchOperatorPause(nodes)
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
