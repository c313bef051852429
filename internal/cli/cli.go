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
	if errors.As(err, &ie) || isFlagError(err) {
		return ExitBadInput
	}
	return ExitFailure
}

// isFlagError recognises cobra's and pflag's usage errors, which have no type of their own.
func isFlagError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown flag", "unknown shorthand flag", "flag needs an argument", "invalid argument", "unknown command", "accepts ", "requires at least", "required flag"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
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
	return root
}

// loadConfig reads the HealthConfig at path (the built-in default when path is empty) and builds
// its policy; anything wrong with either is bad input.
func loadConfig(path string) (*config.HealthConfig, *health.Policy, error) {
	cfg := config.Default()
	if path != "" {
		var err error
		if cfg, err = config.Load(path); err != nil {
			return nil, nil, badInput(err)
		}
	}
	policy, err := cfg.Policy()
	if err != nil {
		return nil, nil, badInput(fmt.Errorf("%s: %w", path, err))
	}
	return cfg, policy, nil
}
