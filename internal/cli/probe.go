package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

func newProbeCommand() *cobra.Command {
	var output, kernelLogPath string
	var rawCalls, kernelLog bool
	var nvmlOpts cmdutil.NVMLOptions
	cmd := &cobra.Command{
		Use:   "probe [--output json|table] [--raw | --kernel-log [--kernel-log-path FILE]]",
		Short: "Show each real GPU's identity, supported checks and current readings (NVML)",
		Long: `probe opens NVML, lists every GPU (UUID, index, PCI bus ID, minor number, model, MIG
instances), the health events each GPU supports, and one round of readings: ECC totals, row
remapping, retired pages, temperature and its thresholds, power, clock-event reasons, PCIe
replays, the PCIe link as trained against the most it can, the row remapper's bank histogram,
the SRAM ECC status, the NVLink fabric registration (and its health mask), NVLink state, errors
and recoveries, and NVML's recovery action. Readings a GPU does not support are listed as
unsupported ("no data", not a fault). Without the NVIDIA driver it exits 1.

--raw prints instead, as JSON {"calls": [...]}, every NVML call the backend
depends on with the driver's own answer (return text and code, and the value when it succeeded):
which optional functions the library has, the supported event mask, ECC mode and counters,
remapped rows and retired pages, temperature thresholds, field 230 (recovery action), the PCIe
link, the row remapper histogram, the SRAM ECC status, the fabric state (both calls, v3 and v2),
each NVLink's state and fields 213/214 (its recoveries), and one event-set wait. Nothing is interpreted: it is what to compare with
nvidia-smi, or with the fixtures of the tests, on a new driver.

--kernel-log checks the kernel log instead of NVML (no driver needed): whether this process may
read /dev/kmsg, and every NVIDIA driver event (XIDs, GPUs fallen off the bus, failed
initialisations) the kernel still holds, as the agent's kernel-log source reads them. Run in the
agent's container (kubectl exec, or a pod with its security context) it tells whether the source
can work there; it exits 1 when the log cannot be read, with the reason.`,
		Example: `  gpuhealth probe
  gpuhealth probe --output json
  gpuhealth probe --raw
  gpuhealth probe --kernel-log -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "json" && output != "table" {
				return cmdutil.BadInput(fmt.Errorf("--output: must be json or table, got %q", output))
			}
			if kernelLog {
				if rawCalls {
					return cmdutil.BadInput(fmt.Errorf("--raw and --kernel-log: choose one"))
				}
				return probeKernelLog(cmd, kernelLogPath, output)
			}
			b, err := nvmlOpts.Open()
			if err != nil {
				return err
			}
			if rawCalls {
				calls := b.RawCalls()
				if err := b.Close(); err != nil {
					return err
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					Calls []gpunvml.RawCall `json:"calls"`
				}{calls})
			}
			rep := b.Probe()
			if err := b.Close(); err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			return writeProbeTable(cmd.OutOrStdout(), rep)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: json or table")
	cmd.Flags().BoolVar(&rawCalls, "raw", false, "print every NVML call the backend makes with the driver's raw answer, as JSON")
	cmd.Flags().BoolVar(&kernelLog, "kernel-log", false, "check the kernel log instead of NVML: readable here?, and the NVIDIA driver's events in it")
	cmd.Flags().StringVar(&kernelLogPath, "kernel-log-path", kmsg.DevKmsg, "the kernel log --kernel-log reads")
	nvmlOpts.AddFlags(cmd.Flags())
	return cmd
}

func probeKernelLog(cmd *cobra.Command, path, output string) error {
	rep, err := kmsg.Probe(cmd.Context(), path)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintf(w, "kernel log:\t%s\n", rep.Path)
		if rep.Readable {
			fmt.Fprintf(w, "readable:\tyes\n")
		} else {
			fmt.Fprintf(w, "readable:\tno: %s\n", rep.Error)
			if rep.Hint != "" {
				fmt.Fprintf(w, "hint:\t%s\n", rep.Hint)
			}
		}
		fmt.Fprintf(w, "records:\t%d (kernel %d; NVRM lines written by processes, ignored: %d; malformed %d; overruns %d)\n",
			rep.Records, rep.KernelRecords, rep.Spoofed, rep.Malformed, rep.Overruns)
		fmt.Fprintf(w, "NVIDIA driver events:\t%d\n", len(rep.Events))
		for _, e := range rep.Events {
			fmt.Fprintf(w, "  [%s]\t%s %s\n", e.Since.Round(time.Millisecond), e.Kind, strings.ReplaceAll(e.Message, "\n", " | "))
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if !rep.Readable {
		return fmt.Errorf("the kernel log %s cannot be read here: %s", rep.Path, rep.Error)
	}
	return nil
}

func writeProbeTable(out io.Writer, rep gpunvml.Report) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "driver version:\t%s\n", orDash(rep.DriverVersion))
	fmt.Fprintf(w, "GPUs:\t%d\n", len(rep.GPUs))
	for _, s := range rep.Skipped {
		fmt.Fprintf(w, "skipped:\t%s\n", s)
	}
	for _, g := range rep.GPUs {
		d, r := g.Device, g.Readings
		fmt.Fprintf(w, "\nGPU %d\t%s\n", d.Index, d.UUID)
		fmt.Fprintf(w, "  model:\t%s\n", orDash(d.Model))
		fmt.Fprintf(w, "  PCI bus ID:\t%s\n", orDash(d.PCIBusID))
		fmt.Fprintf(w, "  minor:\t%d\n", d.Minor)
		for _, m := range g.MIGDevices {
			fmt.Fprintf(w, "  MIG device:\t%s (GPU instance %d, compute instance %d, %s)\n", m.UUID, m.MIG.GPUInstance, m.MIG.ComputeInstance, m.Model)
		}
		events := strings.Join(g.Events, ", ")
		if events == "" {
			events = "none (the GPU would be unmonitored for events)"
		}
		if g.EventsError != "" {
			events = g.EventsError
		}
		fmt.Fprintf(w, "  events:\t%s\n", events)
		if r.Lost {
			fmt.Fprintf(w, "  state:\tLOST (NVML answered ERROR_GPU_IS_LOST)\n")
			continue
		}
		if t := r.Temperature; t != nil {
			fmt.Fprintf(w, "  temperature:\t%d°C (slowdown %s, shutdown %s)\n", t.CurrentC, celsius(t.SlowdownC), celsius(t.ShutdownC))
		}
		if p := r.Power; p != nil {
			limit := "unknown"
			if p.LimitMilliwatts > 0 {
				limit = fmt.Sprintf("%.1f W", float64(p.LimitMilliwatts)/1000)
			}
			fmt.Fprintf(w, "  power:\t%.1f W (limit %s)\n", float64(p.UsageMilliwatts)/1000, limit)
		}
		if e := r.ECC; e != nil {
			fmt.Fprintf(w, "  ECC (volatile):\tcorrected %d, uncorrected %d\n", e.Corrected, e.Uncorrected)
		}
		if rr := r.RemappedRows; rr != nil {
			fmt.Fprintf(w, "  remapped rows:\tcorrected %d, uncorrected %d, pending %t, failure %t\n", rr.Corrected, rr.Uncorrected, rr.Pending, rr.Failure)
		}
		if p := r.RetiredPagesPending; p != nil {
			fmt.Fprintf(w, "  retired pages:\tpending %t\n", *p)
		}
		if c := r.ClockEventReasons; c != nil {
			fmt.Fprintf(w, "  clock events:\t%s\n", clockReasons(uint64(*c), c.String()))
		}
		if p := r.PCIeReplays; p != nil {
			fmt.Fprintf(w, "  PCIe replays:\t%d\n", *p)
		}
		writeEarlyWarnings(w, r)
		if len(r.NVLinks) > 0 {
			down, errs, counted := 0, uint64(0), false
			for _, l := range r.NVLinks {
				if l.Down {
					down++
				}
				if l.Errors != nil {
					errs += *l.Errors
					counted = true
				}
			}
			errText := "error counters unsupported"
			if counted {
				errText = fmt.Sprintf("%d errors", errs)
			}
			fmt.Fprintf(w, "  NVLink:\t%d links, %d down, %s\n", len(r.NVLinks), down, errText)
		}
		if len(r.NVLinkRecoveries) > 0 {
			var ok, failed uint64
			for _, l := range r.NVLinkRecoveries {
				ok, failed = ok+l.Successful, failed+l.Failed
			}
			fmt.Fprintf(w, "  NVLink recoveries:\t%d successful, %d failed (lifetime, %d links)\n", ok, failed, len(r.NVLinkRecoveries))
		}
		if a := r.RecoveryAction; a != nil {
			fmt.Fprintf(w, "  recovery action:\t%s\n", a)
		}
		if len(r.Unsupported) > 0 {
			fmt.Fprintf(w, "  unsupported:\t%s\n", strings.Join(r.Unsupported, ", "))
		}
		for _, e := range r.Errors {
			fmt.Fprintf(w, "  error:\t%s\n", e)
		}
	}
	return w.Flush()
}

// writeEarlyWarnings shows the readings that warn before a GPU fails, and the fabric state.
func writeEarlyWarnings(w io.Writer, r gpunvml.Readings) {
	if l := r.PCIeLink; l != nil {
		most := "unknown"
		switch {
		case l.MaxGen > 0 && l.MaxWidth > 0:
			most = fmt.Sprintf("gen %d x%d", l.MaxGen, l.MaxWidth)
		case l.MaxGen > 0:
			most = fmt.Sprintf("gen %d, width unknown", l.MaxGen)
		case l.MaxWidth > 0:
			most = fmt.Sprintf("x%d, generation unknown", l.MaxWidth)
		}
		fmt.Fprintf(w, "  PCIe link:\tgen %d x%d (the most it can here: %s)\n", l.Gen, l.Width, most)
	}
	if h := r.RowRemapHistogram; h != nil {
		fmt.Fprintf(w, "  row remapper banks:\t%d with all spare rows, %d high, %d partial, %d low, %d none\n", h.Max, h.High, h.Partial, h.Low, h.None)
	}
	if s := r.SRAM; s != nil {
		fmt.Fprintf(w, "  SRAM ECC:\tthreshold exceeded %t (aggregate: %d uncorrected, %d corrected)\n", s.ThresholdExceeded, s.AggregateUncorrected, s.AggregateCorrected)
	}
	if f := r.Fabric; f != nil {
		fmt.Fprintf(w, "  NVLink fabric:\t%s\n", f)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func celsius(v int64) string {
	if v <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d°C", v)
}

func clockReasons(bits uint64, named string) string {
	if bits == 0 {
		return "none"
	}
	return fmt.Sprintf("%s (0x%x)", named, bits)
}
