package cli

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

// logOptions are the logging flags of long-running commands.
type logOptions struct {
	format    string
	verbosity int
}

func (o *logOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.format, "log-format", "text", "log format: text or json")
	fs.IntVarP(&o.verbosity, "v", "v", 0, "log verbosity (0-10)")
}

// logger builds the logger for a command and installs it as klog's global logger too, so that
// client-go's own log lines go the same way. Only commands do this; libraries take a logger.
// context returns the command's context carrying the logger the options make, writing to the
// command's standard error.
func (o *logOptions) context(cmd *cobra.Command) (context.Context, error) {
	logger, err := o.logger(cmd.ErrOrStderr())
	if err != nil {
		return nil, err
	}
	return klog.NewContext(cmd.Context(), logger), nil
}

func (o *logOptions) logger(w io.Writer) (logr.Logger, error) {
	var l logr.Logger
	switch o.format {
	case "text":
		l = textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(o.verbosity), textlogger.Output(w)))
	case "json":
		h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.Level(-o.verbosity)})
		l = logr.FromSlogHandler(h)
	default:
		return logr.Discard(), badInput(fmt.Errorf("--log-format: must be text or json, got %q", o.format))
	}
	klog.SetLoggerWithOptions(l, klog.ContextualLogger(true))
	return l, nil
}
