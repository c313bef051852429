// Package cli builds the gpuhealth command tree. Every command returns an error instead of
// exiting; Execute maps errors to exit codes in one place: 0 success, 2 bad input (a file, a
// flag or an argument the user can fix), 1 anything else.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// Exit codes.
const (
	ExitOK       = 0
	ExitFailure  = 1
	ExitBadInput = 2
)

// inputError marks an error the user fixes by changing their input.
type inputError struct{ err error }

func (e inputError) Error() string { return e.err.Error() }
func (e inputError) Unwrap() error { return e.err }

func badInput(err error) error { return inputError{err} }

// Execute runs the command line args and returns the process exit code.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	// A panic is a bug; it still ends as one line and exit status 1, never a stack trace.
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "gpuhealth: internal error: %v\n", r)
			code = ExitFailure
		}
	}()
	root := NewRootCommand(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	// One line, never a stack trace.
	fmt.Fprintln(stderr, "gpuhealth: "+strings.ReplaceAll(err.Error(), "\n", "; "))
	var ie inputError
	if errors.As(err, &ie) {
		return ExitBadInput
	}
	return ExitFailure
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
	root.AddCommand(newSimulateCommand(), newVersionCommand(), newProbeCommand(), newWatchCommand(), newAgentCommand(), newDrainCommand(), newUndrainCommand(), newStatusCommand(), newExtenderCommand(), newDevicePluginCommand(), newBreakerCommand())
	// Cobra adds these when it executes; added now, markUsageErrors covers them too.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	// Cobra's and pflag's usage errors have no type of their own; they become bad input where
	// they arise instead of being recognised later by their text.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return badInput(err) }) // subcommands inherit it
	markUsageErrors(root)
	return root
}

// markUsageErrors makes the argument errors of cmd and every command below it bad input: a
// command's own Args check, and for a command that only groups others an argument that names
// none of them. Such a command shows its help when run alone, as cobra does; cobra checks
// arguments only of commands that run, so it gets a Run that does that.
func markUsageErrors(cmd *cobra.Command) {
	if cmd.HasSubCommands() && !cmd.Runnable() {
		if cmd.Args == nil {
			cmd.Args = noSubcommand
		}
		cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	if check := cmd.Args; check != nil {
		cmd.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return badInput(err)
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		markUsageErrors(sub)
	}
}

// noSubcommand is the Args of a command that groups others: any argument left once cobra has
// looked for a subcommand names none.
func noSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	err := fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		err = fmt.Errorf("%w (did you mean %s?)", err, strings.Join(s, " or "))
	}
	return err
}

// loadConfig reads the HealthConfig at path (the built-in default when path is empty) and builds
// its policy; anything wrong with either is bad input.
func loadConfig(path string) (*config.HealthConfig, *health.Policy, error) {
	cfg, policy, err := config.LoadPolicy(path)
	if err != nil {
		return nil, nil, badInput(err)
	}
	return cfg, policy, nil
}
