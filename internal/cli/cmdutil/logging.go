package cmdutil

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// LogOptions are the logging flags of long-running commands.
type LogOptions struct {
	Format    string
	Verbosity int
}

// AddFlags adds --log-format and -v to fs.
func (o *LogOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Format, "log-format", "text", "log format: text or json")
	fs.IntVarP(&o.Verbosity, "v", "v", 0, "log verbosity (0-10)")
}

// Context returns the command's context carrying the logger the options make, writing to the
// command's standard error.
func (o *LogOptions) Context(cmd *cobra.Command) (context.Context, error) {
	logger, err := o.Logger(cmd.ErrOrStderr())
	if err != nil {
		return nil, err
	}
	return klog.NewContext(cmd.Context(), logger), nil
}

// RunE is the RunE of a long-running command with these logging flags: it makes the logger
// first (a bad --log-format is the first thing said), then checks the command's other flags with
// validate, then runs run with the logger in its context.
func (o *LogOptions) RunE(validate func() error, run func(ctx context.Context) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		ctx, err := o.Context(cmd)
		if err != nil {
			return err
		}
		if err := validate(); err != nil {
			return err
		}
		return run(ctx)
	}
}

// Logger builds the logger for a command and installs it as klog's global logger too, so that
// client-go's own log lines go the same way. Only commands do this; libraries take a logger.
func (o *LogOptions) Logger(w io.Writer) (logr.Logger, error) {
	var l logr.Logger
	switch o.Format {
	case "text":
		l = textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(o.Verbosity), textlogger.Output(w)))
	case "json":
		h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.Level(-o.Verbosity)})
		l = logr.FromSlogHandler(h)
	default:
		return logr.Discard(), BadInput(fmt.Errorf("--log-format: must be text or json, got %q", o.Format))
	}
	klog.SetLoggerWithOptions(l, klog.ContextualLogger(true))
	return l, nil
}
