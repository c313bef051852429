package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/simdriver"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

func newSimDriverCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim-driver",
		Short: "A simulated NVIDIA driver: real NVML programs on simulated GPUs, faults injected at run time",
		Long: `sim-driver installs gpuhealth's simulated libnvidia-ml.so.1 into a driver root and serves a
scenario's GPUs to every process that loads it from there: gpuhealth's own NVML backend
(--backend nvml --driver-root DIR), NVIDIA's nvidia-smi, device plugins and DRA drivers. See
docs/nvml.md, "The simulated driver".`,
	}
	cmd.AddCommand(newSimDriverServeCommand(), newSimDriverInjectCommand())
	return cmd
}

func newSimDriverServeCommand() *cobra.Command {
	var scenarioPath, driverRoot, version, libraryDir, librarySubdir string
	var logs logOptions
	cmd := &cobra.Command{
		Use:   "serve --scenario FILE --driver-root DIR [--driver-version V]",
		Short: "Install the simulated driver into DIR and serve the scenario's GPUs until stopped",
		Long: `serve installs the simulated libnvidia-ml.so.1 of one driver profile (470.256.02, 525.147.05,
535.261.03 or 550.163.01: exactly the functions NVIDIA's library of that branch exports) into
DIR/usr/lib/<triplet>, and serves the scenario's GPUs on the real clock until SIGINT/SIGTERM. Every
process that loads the library from DIR, started before or after, sees the same GPUs and faults.
Stopped, the library answers as a driver that is not loaded. A scenario error exits 2 naming the
line and field; kernel-log lines and reboots are refused (a driver serves neither).`,
		Example: `  gpuhealth sim-driver serve --scenario examples/scenario.yaml --driver-root /tmp/driver &
  gpuhealth probe --driver-root /tmp/driver
  gpuhealth sim-driver inject --driver-root /tmp/driver '{gpu: 2, xid: 79}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, err := logs.context(cmd)
			if err != nil {
				return err
			}
			if scenarioPath == "" || driverRoot == "" {
				return cmdutil.BadInput(errors.New("--scenario and --driver-root: both required"))
			}
			sc, err := sim.LoadDriverScenario(scenarioPath)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			if err := simdriver.CheckScenario(sc); err != nil {
				return cmdutil.BadInput(fmt.Errorf("%s: %w", scenarioPath, err))
			}
			return simdriver.Serve(ctx, simdriver.Options{Scenario: sc, DriverRoot: driverRoot, Version: version,
				LibraryDir: libraryDir, LibrarySubdir: librarySubdir, Logger: klog.FromContext(ctx)})
		},
	}
	f := cmd.Flags()
	f.StringVar(&scenarioPath, "scenario", "", "scenario file (docs/scenario.md)")
	f.StringVar(&driverRoot, "driver-root", "", "driver root to install the simulated driver into")
	f.StringVar(&version, "driver-version", "", "driver profile: a version or a branch such as 535 (default: the newest)")
	f.StringVar(&librarySubdir, "library-subdir", "", "the directory inside --driver-root the library goes to (default usr/lib/<triplet>; the GPU operator's driver container has usr/lib64)")
	f.StringVar(&libraryDir, "library-dir", "", "where the built libraries are (default: sim-driver beside this binary, or $"+simdriver.LibraryDirEnv+")")
	logs.addFlags(f)
	return cmd
}

func newSimDriverInjectCommand() *cobra.Command {
	var driverRoot string
	cmd := &cobra.Command{
		Use:   "inject --driver-root DIR 'EVENT'",
		Short: "Apply one scenario event (without at) at once on the simulator serving DIR",
		Long: `inject applies EVENT, one scenario event in the scenario file's own YAML form without at
(docs/scenario.md), on the simulator serving DIR, at once. A bad event exits 2 and changes nothing.`,
		Example: `  gpuhealth sim-driver inject --driver-root /tmp/driver '{gpu: 2, xid: 79}'
  gpuhealth sim-driver inject --driver-root /tmp/driver '{gpu: 0, ecc: {uncorrectedVolatile: 1}}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if driverRoot == "" {
				return cmdutil.BadInput(errors.New("--driver-root: required"))
			}
			err := simdriver.Inject(driverRoot, args[0])
			if errors.Is(err, simdriver.ErrInjectRefused) {
				return cmdutil.BadInput(err)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&driverRoot, "driver-root", "", "driver root the simulator serves")
	return cmd
}
