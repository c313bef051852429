package cli

import (
	"context"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
)

// logOptions are the logging flags of long-running commands (cmdutil.LogOptions).
type logOptions struct{ cmdutil.LogOptions }

func (o *logOptions) addFlags(fs *pflag.FlagSet) { o.AddFlags(fs) }

// context returns the command's context carrying the logger the options make.
func (o *logOptions) context(cmd *cobra.Command) (context.Context, error) { return o.Context(cmd) }
