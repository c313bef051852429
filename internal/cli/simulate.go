package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/simulate"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

func newSimulateCommand() *cobra.Command {
	var scenarioPath, configPath, output string
	cmd := &cobra.Command{
		Use:   "simulate --scenario FILE [--config FILE] [--output json|table]",
		Short: "Replay a scenario of GPU faults on virtual time and print the outcome",
		Long: `simulate replays a scenario file (simulated GPUs and timed faults and repairs) through the
health library on virtual time - an hour of scenario takes milliseconds - and prints each GPU's
final state and every health transition. Exit status 2 means the scenario or config is invalid.`,
		Example: `  gpuhealth simulate --scenario examples/scenario.yaml
  gpuhealth simulate --scenario examples/scenario.yaml --config examples/healthconfig.yaml --output table`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "json" && output != "table" {
				return cmdutil.BadInput(fmt.Errorf("--output: must be json or table, got %q", output))
			}
			if scenarioPath == "" {
				return cmdutil.BadInput(fmt.Errorf("--scenario: required"))
			}
			sc, err := sim.LoadScenario(scenarioPath)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			cfg, policy, err := cmdutil.LoadConfig(configPath)
			if err != nil {
				return err
			}
			res, err := simulate.Run(cmd.Context(), sc, policy, simulate.Options{SampleInterval: cfg.SampleEvery()})
			if err != nil {
				return err
			}
			if output == "table" {
				return res.WriteTable(cmd.OutOrStdout())
			}
			return res.WriteJSON(cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&scenarioPath, "scenario", "", "scenario file to replay (required)")
	cmd.Flags().StringVar(&configPath, "config", "", "HealthConfig file (default: the built-in default profile)")
	cmd.Flags().StringVarP(&output, "output", "o", "json", "output format: json or table")
	return cmd
}
