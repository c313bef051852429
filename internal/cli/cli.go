// Package cli builds the gpuhealth command tree. Every command returns an error instead of
// exiting; Execute maps errors to exit codes in one place: 0 success, 2 bad input (a file, a
// flag or an argument the user can fix), 1 anything else.
package cli

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuhealth/gpuhealth/internal/cli/agentcmd"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
)

// Exit codes.
const (
	ExitOK       = cmdutil.ExitOK
	ExitFailure  = cmdutil.ExitFailure
	ExitBadInput = cmdutil.ExitBadInput
)

// Execute runs the command line args and returns the process exit code.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cmdutil.Execute(ctx, NewRootCommand(stdout, stderr), args, stderr)
}

// NewRootCommand builds the command tree.
func NewRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "gpuhealth",
		Short: "Keep Kubernetes from putting work on broken GPUs",
		Long: `gpuhealth watches each GPU (XIDs, ECC, row remapping, temperature, throttling, PCIe and
NVLink errors, NVML's recovery action), decides per GPU whether it is Healthy, Degraded or
Unhealthy, and recovers it when the fault clears.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newSimulateCommand(), newVersionCommand(), newProbeCommand(), newWatchCommand(), agentcmd.NewCommand(), newDrainCommand(), newUndrainCommand(), newClearCommand(), newValidateCommand(), newStatusCommand(), newExtenderCommand(), newDevicePluginCommand(), newBreakerCommand(), newFleetCommand(), newHistoryCommand(), newSimDriverCommand(), newKmsgRelayCommand())
	// Cobra adds these when it executes; added now, MarkUsageErrors covers them too.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	cmdutil.MarkUsageErrors(root)
	return root
}
