package cli

import (
	"errors"
	"fmt"
	"math"
	"strings"

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
	cmd.AddCommand(newSimDriverServeCommand(), newSimDriverInjectCommand(), newSimDriverDCGMICommand())
	return cmd
}

func newSimDriverServeCommand() *cobra.Command {
	var scenarioPath, driverRoot, version, libraryDir, librarySubdir, dcgmVersion string
	var injectUIDs []uint
	var logs logOptions
	cmd := &cobra.Command{
		Use:   "serve --scenario FILE --driver-root DIR [--driver-version V]",
		Short: "Install the simulated driver into DIR and serve the scenario's GPUs until stopped",
		Long: `serve installs the simulated libnvidia-ml.so.1 of one driver profile (470.256.02, 525.147.05,
535.261.03 or 550.163.01: exactly the functions NVIDIA's library of that branch exports) into
DIR/usr/lib/<triplet>, and serves the scenario's GPUs on the real clock until SIGINT/SIGTERM. Every
process that loads the library from DIR, started before or after, sees the same GPUs and faults.
Stopped, the library answers as a driver that is not loaded. A scenario error exits 2 naming the
line and field; kernel-log lines and reboots are refused (a driver serves neither).

serve also installs DIR/usr/bin/dcgmi, which runs this binary's sim-driver dcgmi: the simulator
is the node's DCGM host engine, and answers diagnostics of its GPUs as the scenario's diag and
latent events say (docs/scenario.md).

Its socket, beside the library, is open to every user, as /dev/nvidiactl is: any process may read
the GPUs. Changing them (sim-driver inject, nvidia-smi --gpu-reset) is for root, the simulator's
own user and the users of --inject-uid, from the simulator's own pid namespace only: a process
in a container of its own is refused, root or not.`,
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
			if !strings.HasPrefix(dcgmVersion, "3.") && !strings.HasPrefix(dcgmVersion, "4.") {
				return cmdutil.BadInput(fmt.Errorf("--dcgm-version %q: the simulated dcgmi speaks DCGM 3.x and 4.x (%s, %s)", dcgmVersion, sim.DCGMVersion3, sim.DCGMVersion4))
			}
			sc, err := sim.LoadDriverScenario(scenarioPath)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			if err := simdriver.CheckScenario(sc); err != nil {
				return cmdutil.BadInput(fmt.Errorf("%s: %w", scenarioPath, err))
			}
			uids := make([]uint32, 0, len(injectUIDs))
			for _, u := range injectUIDs {
				if u > math.MaxUint32 {
					return cmdutil.BadInput(fmt.Errorf("--inject-uid %d: not a uid", u))
				}
				uids = append(uids, uint32(u))
			}
			return simdriver.Serve(ctx, simdriver.Options{Scenario: sc, DriverRoot: driverRoot, Version: version,
				LibraryDir: libraryDir, LibrarySubdir: librarySubdir, Logger: klog.FromContext(ctx), DCGMVersion: dcgmVersion,
				InjectUIDs: uids})
		},
	}
	f := cmd.Flags()
	f.StringVar(&scenarioPath, "scenario", "", "scenario file (docs/scenario.md)")
	f.StringVar(&driverRoot, "driver-root", "", "driver root to install the simulated driver into")
	f.StringVar(&version, "driver-version", "", "driver profile: a version or a branch such as 535 (default: the newest)")
	f.StringVar(&librarySubdir, "library-subdir", "", "the directory inside --driver-root the library goes to (default usr/lib/<triplet>; the GPU operator's driver container has usr/lib64)")
	f.StringVar(&libraryDir, "library-dir", "", "where the built libraries are (default: sim-driver beside this binary, or $"+simdriver.LibraryDirEnv+")")
	f.UintSliceVar(&injectUIDs, "inject-uid", nil, "a user, besides root and the simulator's own, whose processes in the simulator's pid namespace may inject and reset GPUs (repeatable)")
	f.StringVar(&dcgmVersion, "dcgm-version", sim.DCGMVersion4, "the DCGM version the installed dcgmi speaks: "+sim.DCGMVersion4+" (4.x's JSON) or "+sim.DCGMVersion3+" (3.x's)")
	logs.addFlags(f)
	return cmd
}

func newSimDriverInjectCommand() *cobra.Command {
	var driverRoot string
	cmd := &cobra.Command{
		Use:   "inject --driver-root DIR 'EVENT'",
		Short: "Apply one scenario event (without at) at once on the simulator serving DIR",
		Long: `inject applies EVENT, one scenario event in the scenario file's own YAML form without at
(docs/scenario.md), on the simulator serving DIR, at once. A bad event exits 2 and changes nothing.
The simulator takes injections from root, its own user and the users of its --inject-uid, from
its own pid namespace only (not from a container of its own): any other process is refused, exit 1.`,
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

func newSimDriverDCGMICommand() *cobra.Command {
	return &cobra.Command{
		Use:   "dcgmi --driver-root DIR [--dcgm-version 4.2.3|3.3.9] diag -r N -i gpu:ID [-j] [-t SECONDS] [--host H] | discovery -l",
		Short: "NVIDIA's dcgmi on the simulated driver: a DCGM diagnostic of one simulated GPU",
		Long: `dcgmi plays NVIDIA's DCGM command line for the simulator serving DIR, which answers as the node's
DCGM host engine: dcgmi diag of one GPU (-i gpu:ID or ID; 3.x: -i/--gpuList ID) prints DCGM's
document (4.x's, or 3.x's with --dcgm-version 3.3.9; the text table without -j) and exits with
DCGM's status: 0 pass or skip, 205 a failure of severity ISOLATE, 226 another finding, 203 a
diagnostic -t killed, 217 another diagnostic runs, 235 no simulator answers. --host is accepted
and never dialed. dcgmi discovery -l lists the GPUs by DCGM id. Every call is appended to
DIR/dcgmi-calls.log. sim-driver serve installs DIR/usr/bin/dcgmi, which runs this command.
See docs/nvml.md, "The simulated driver".`,
		Example: `  gpuhealth sim-driver dcgmi --driver-root /tmp/driver diag -r 2 -i gpu:2 -j
  /tmp/driver/usr/bin/dcgmi diag -r 2 -i gpu:2 -j`,
		// dcgmi's options are its own (-i gpu:2, --gpuList): it parses them as DCGM's does.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			code := simdriver.DCGMI(cmd.Context(), args, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if code != 0 {
				// dcgmi's exit status is its answer (a dcgmReturn_t modulo 256: 205, 226, 235...).
				return cmdutil.ExitStatus{Code: code}
			}
			return nil
		},
	}
}
