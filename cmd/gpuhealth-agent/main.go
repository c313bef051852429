// Command gpuhealth-agent is `gpuhealth agent` alone: the same command, flags and behaviour,
// without the extender, device plugin, breaker controller and CLI commands linked in. It is the
// binary the DaemonSet runs, on every GPU node, where its memory counts (docs/benchmarks.md): a
// process maps the pages of its binary, and nothing a CLI command links later (one transitive
// html/template import once doubled gpuhealth) can grow the agent. The image ships it beside
// gpuhealth. A leading "agent" argument is accepted, so that `gpuhealth-agent agent FLAGS` and
// `gpuhealth agent FLAGS` run the same thing.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpuhealth/gpuhealth/internal/cli/agentcmd"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the agent command with args and returns the exit code, as cmdutil.Execute maps it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := agentcmd.NewCommand()
	root.Use = "gpuhealth-agent [agent] [flags]"
	root.SilenceUsage, root.SilenceErrors = true, true
	root.SetOut(stdout)
	root.SetErr(stderr)
	// cobra's default version line: a custom template would bring in text/template, whose
	// MethodByName makes the linker keep every exported method of every type (a binary twice as
	// large).
	root.Version = version.String()
	cmdutil.MarkUsageErrors(root)
	if len(args) > 0 && args[0] == "agent" {
		args = args[1:]
	}
	return cmdutil.Execute(ctx, root, args, stderr)
}
