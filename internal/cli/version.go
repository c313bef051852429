package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpuhealth/gpuhealth/internal/version"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "gpuhealth %s\n", version.String())
			return err
		},
	}
}
