// Command device-plugin is a kubelet device plugin for simulated NVIDIA GPUs (nvidia.com/gpu),
// built only on gpuhealth's public packages: health.Runtime runs the health library on the
// simulated GPUs of pkg/gpu/sim, and pkg/deviceplugin serves the result to the kubelet, marking
// sick GPUs Unhealthy and recovered ones Healthy again. docs/embedding.md walks through it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/deviceplugin"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// options are the command line.
type options struct {
	scenario     string
	config       string
	checkpoint   string
	resourceName string
	socketDir    string
	cdi          bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := parseAndRun(ctx, os.Args[1:])
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "device-plugin:", err)
		os.Exit(1)
	}
}

func parseAndRun(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("device-plugin", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.scenario, "scenario", "", "scenario file of the simulated GPUs (required; see docs/scenario.md)")
	fs.StringVar(&o.config, "config", "", "HealthConfig file (default: the built-in default profile)")
	fs.StringVar(&o.checkpoint, "checkpoint", "", "file keeping sticky faults across restarts on the same boot (default: none)")
	fs.StringVar(&o.resourceName, "resource-name", deviceplugin.DefaultResourceName, "extended resource to serve")
	fs.StringVar(&o.socketDir, "kubelet-socket-dir", deviceplugin.DefaultDir, "the kubelet's device-plugins directory (holds kubelet.sock)")
	fs.BoolVar(&o.cdi, "cdi", false, "allocate GPUs as CDI devices nvidia.com/gpu=<UUID> instead of NVIDIA_VISIBLE_DEVICES")
	klog.InitFlags(fs) // -v and the other klog flags; main owns the process's logging
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.scenario == "" {
		return errors.New("--scenario: required")
	}
	return run(ctx, o)
}

// run wires simulated GPUs → health.Runtime → the device plugin, and runs them until ctx ends
// or a part fails.
func run(ctx context.Context, o options) error {
	logger := klog.Background().WithValues("resource", o.resourceName)
	ctx = klog.NewContext(ctx, logger)

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

	svc := deviceplugin.NewService(rt.Monitor(), deviceplugin.ServiceOptions{CDI: o.cdi})
	plugin := deviceplugin.NewPlugin(svc, deviceplugin.PluginOptions{ResourceName: o.resourceName, Dir: o.socketDir})
	logger.Info("Serving simulated GPUs", "gpus", len(backend.Devices()), "scenario", o.scenario, "socket", plugin.SocketPath())

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		// Ticks, checkpoints and the simulator's event stream, until gctx ends.
		return rt.Run(gctx, func(ctx context.Context, m *health.Monitor) error { return backend.Run(ctx, m) })
	})
	g.Go(func() error {
		// Serves, registers, and registers again after every kubelet restart.
		return plugin.Run(gctx)
	})
	g.Go(func() error { return logTransitions(gctx, rt.Monitor()) })
	err = g.Wait()
	logger.Info("Stopped")
	return err
}

// logTransitions logs every change of a GPU's health: the operator's view of what the kubelet
// is told.
func logTransitions(ctx context.Context, m *health.Monitor) error {
	logger := klog.FromContext(ctx)
	sub := m.Subscribe()
	defer sub.Close()
	for {
		u, ok := sub.Wait(ctx)
		if !ok {
			return nil
		}
		for _, tr := range u.Transitions {
			logger.Info("GPU health changed", "gpu", tr.Device.UUID, "index", tr.Device.Index,
				"from", tr.From, "to", tr.To, "reason", tr.Reason)
		}
	}
}
