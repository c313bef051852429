// Command gpuhealth keeps Kubernetes from putting work on broken GPUs. See the README.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpuhealth/gpuhealth/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
