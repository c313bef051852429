// Package cmdutil is what every gpuhealth command shares, in a package of its own so that the
// lean agent binary (cmd/gpuhealth-agent) gets it without linking the other commands: exit codes
// and the one place errors become them, bad-input errors, the logging flags, loading the
// HealthConfig and building a component's API client.
package cmdutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// Exit codes.
const (
	ExitOK       = 0
	ExitFailure  = 1
	ExitBadInput = 2
)

// InputError marks an error the user fixes by changing their input.
type InputError struct{ Err error }

func (e InputError) Error() string { return e.Err.Error() }
func (e InputError) Unwrap() error { return e.Err }

// BadInput marks err as one the user fixes by changing their input (exit status 2).
func BadInput(err error) error { return InputError{err} }

// ExitStatus is a command's answer given as its exit status alone, as a tool that gpuhealth
// plays (the simulated driver's dcgmi: 205, 226, 235...) answers: Execute exits with Code and
// prints nothing, the command having written its output.
type ExitStatus struct{ Code int }

func (e ExitStatus) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Execute runs root with args and returns the process exit code: 0 success, 2 bad input (a
// file, a flag or an argument the user can fix), 1 anything else. An error is one line on stderr.
func Execute(ctx context.Context, root *cobra.Command, args []string, stderr io.Writer) (code int) {
	// A panic is a bug; it still ends as one line and exit status 1, never a stack trace.
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "gpuhealth: internal error: %v\n", r)
			code = ExitFailure
		}
	}()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var status ExitStatus
	if errors.As(err, &status) {
		return status.Code
	}
	// One line, never a stack trace.
	fmt.Fprintln(stderr, "gpuhealth: "+strings.ReplaceAll(err.Error(), "\n", "; "))
	var ie InputError
	if errors.As(err, &ie) {
		return ExitBadInput
	}
	return ExitFailure
}

// MarkUsageErrors makes flag errors, and the argument errors of cmd and every command below it,
// bad input: a command's own Args check, and for a command that only groups others an argument
// that names none of them. Such a command shows its help when run alone, as cobra does; cobra
// checks arguments only of commands that run, so it gets a Run that does that. Call it on the
// root once the tree is built.
func MarkUsageErrors(cmd *cobra.Command) {
	if !cmd.HasParent() {
		// Cobra's and pflag's usage errors have no type of their own; they become bad input
		// where they arise instead of being recognised later by their text.
		cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return BadInput(err) }) // subcommands inherit it
	}
	if cmd.HasSubCommands() && !cmd.Runnable() {
		if cmd.Args == nil {
			cmd.Args = noSubcommand
		}
		cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	if check := cmd.Args; check != nil {
		cmd.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return BadInput(err)
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		MarkUsageErrors(sub)
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

// LoadConfig reads the HealthConfig at path (the built-in default when path is empty) and builds
// its policy; anything wrong with either is bad input.
func LoadConfig(path string) (*config.HealthConfig, *health.Policy, error) {
	cfg, policy, err := config.LoadPolicy(path)
	if err != nil {
		return nil, nil, BadInput(err)
	}
	return cfg, policy, nil
}

// ComponentConfig is the rest.Config of a long-running component (agent, extender, breaker
// controller): from a kubeconfig file, or from the in-cluster configuration, with its user agent
// and rate limits.
func ComponentConfig(kubeconfig, userAgent string, qps float32, burst int) (*rest.Config, error) {
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
	cfg.UserAgent = userAgent
	cfg.QPS, cfg.Burst = qps, burst
	return cfg, nil
}
