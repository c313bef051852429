package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/nodegpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func newWatchCommand() *cobra.Command {
	var configPath, output string
	var backend nodegpu.BackendFlags
	var nvmlOpts cmdutil.NVMLOptions
	cmd := &cobra.Command{
		Use:   "watch [--backend nvml|sim] [--scenario FILE] [--config FILE] [--output json|table]",
		Short: "Watch this node's GPUs without Kubernetes and print each health transition",
		Long: `watch runs the health monitor on this node and prints every transition of a GPU (or MIG
instance) between Healthy, Degraded and Unhealthy as it happens: the way to check a node by hand.

With --backend nvml (the default) it watches the real GPUs through NVML until interrupted
(SIGINT or SIGTERM); without the NVIDIA driver it exits 1. With --backend sim it replays a
scenario file on the real clock and exits at the scenario's end.

--output json prints one JSON object per line: time, index, uuid, from, to, reason (and mig for
a MIG instance).`,
		Example: `  gpuhealth watch
  gpuhealth watch --output json --config examples/healthconfig.yaml
  gpuhealth watch --backend sim --scenario examples/scenario.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "json" && output != "table" {
				return cmdutil.BadInput(fmt.Errorf("--output: must be json or table, got %q", output))
			}
			if err := backend.Validate(); err != nil {
				return err
			}
			cfg, policy, err := cmdutil.LoadConfig(configPath)
			if err != nil {
				return err
			}
			logger := funcr.New(func(prefix, args string) {
				fmt.Fprintln(cmd.ErrOrStderr(), prefix, args)
			}, funcr.Options{})

			var be gpu.Backend
			if backend.Backend == "sim" {
				sc, err := sim.LoadScenario(backend.Scenario)
				if err != nil {
					return cmdutil.BadInput(err)
				}
				be = sim.New(sc, sim.Options{Clock: clock.RealClock{}, SampleInterval: cfg.SampleEvery()})
			} else {
				b, err := nvmlOpts.Open(gpunvml.WithSamplePeriod(cfg.SampleEvery()), gpunvml.WithLogger(logger))
				if err != nil {
					return err
				}
				defer func() {
					if err := b.Close(); err != nil {
						logger.Error(err, "closing NVML")
					}
				}()
				be = b
			}
			return runWatch(klog.NewContext(cmd.Context(), logger), be, policy, output, cmd.OutOrStdout())
		},
	}
	// watch's own help for the flags of nodegpu.BackendFlags, checked by its Validate.
	cmd.Flags().StringVar(&backend.Backend, "backend", "nvml", "GPU backend: nvml (this node's GPUs) or sim (a scenario)")
	cmd.Flags().StringVar(&backend.Scenario, "scenario", "", "scenario file to replay (with --backend sim)")
	cmd.Flags().StringVar(&configPath, "config", "", "HealthConfig file (default: the built-in default profile)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: json or table")
	nvmlOpts.AddFlags(cmd.Flags())
	return cmd
}

// runWatch runs backend into a monitor and prints each transition until the backend returns
// (the end of a scenario) or ctx ends (a signal). The backend runs in a goroutine this function
// waits for; it logs through ctx's logger.
func runWatch(ctx context.Context, backend gpu.Backend, policy *health.Policy, output string, out io.Writer) error {
	log := klog.FromContext(ctx)
	devices := backend.Devices()
	rt, err := health.NewRuntime(policy, devices, health.RuntimeOptions{})
	if err != nil {
		return err
	}
	sub := rt.Monitor().Subscribe()
	defer sub.Close()
	sub.Next() // the initial all-healthy state is not a transition

	p := transitionPrinter{out: out, json: output == "json"}
	if err := p.header(devices); err != nil {
		return err
	}

	// The runtime ticks the monitor (quiet periods end with time, not only with signals) and runs
	// the backend; the backend's end, not the runtime's, ends watch.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	srcDone := make(chan error, 1)
	rtDone := make(chan struct{})
	go func() {
		defer close(rtDone)
		// The feed always returns nil (its error goes to srcDone), so Run has none to return.
		_ = rt.Run(runCtx, func(ctx context.Context, m *health.Monitor) error {
			srcDone <- backend.Run(ctx, m)
			return nil
		})
	}()
	for {
		select {
		case <-sub.C():
			if err := p.update(sub, log); err != nil {
				// Stdout is gone; stop the backend and report why.
				cancel()
				<-rtDone
				if rerr := <-srcDone; rerr != nil && !errors.Is(rerr, context.Canceled) {
					err = errors.Join(err, rerr)
				}
				return err
			}
		case err := <-srcDone:
			cancel()
			<-rtDone
			// Print what the last signals changed, then stop.
			if perr := p.update(sub, log); perr != nil {
				return perr
			}
			if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return nil // interrupted: not a failure
			}
			return err
		}
	}
}

type transitionPrinter struct {
	out  io.Writer
	json bool
}

// transitionJSON is one line of `watch --output json`.
type transitionJSON struct {
	Time   time.Time            `json:"time"`
	Index  int                  `json:"index"`
	UUID   string               `json:"uuid"`
	MIG    *health.MIGPlacement `json:"mig,omitempty"`
	From   health.Severity      `json:"from"`
	To     health.Severity      `json:"to"`
	Reason string               `json:"reason"`
}

func (p transitionPrinter) header(devices []health.Device) error {
	if p.json {
		return nil
	}
	_, err := fmt.Fprintf(p.out, "watching %d devices; transitions:\n%-30s  %-5s  %-42s  %-22s  %s\n",
		len(devices), "TIME", "INDEX", "UUID", "FROM -> TO", "REASON")
	return err
}

func (p transitionPrinter) update(sub *health.Subscription, log logr.Logger) error {
	u, ok := sub.Next()
	if !ok {
		return nil
	}
	if u.Dropped > 0 {
		log.Info("watch fell behind: transitions were dropped", "dropped", u.Dropped)
	}
	for _, t := range u.Transitions {
		if err := p.print(t); err != nil {
			return err
		}
	}
	return nil
}

func (p transitionPrinter) print(t health.Transition) error {
	if p.json {
		b, err := json.Marshal(transitionJSON{Time: t.Time, Index: t.Device.Index, UUID: t.Device.UUID, MIG: t.Device.MIG,
			From: t.From, To: t.To, Reason: t.Reason})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.out, "%s\n", b)
		return err
	}
	_, err := fmt.Fprintf(p.out, "%-30s  %-5d  %-42s  %-22s  %s\n", t.Time.Format(time.RFC3339Nano), t.Device.Index,
		t.Device.UUID, t.From.String()+" -> "+t.To.String(), t.Reason)
	return err
}
