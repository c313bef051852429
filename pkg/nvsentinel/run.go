package nvsentinel

import (
	"bufio"
	"context"
	"io"
	"slices"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
)

// Run publishes sub's updates until ctx ends: each snapshot goes to Update, and Flush runs after
// it, when a failed send's backoff has passed and every probe period. It is what an embedder of
// the health library runs beside its Monitor:
//
//	pub := nvsentinel.NewPublisher(nvsentinel.Options{MapOptions: nvsentinel.MapOptions{NodeName: node}})
//	defer pub.Close()
//	g.Go(func() error { return pub.Run(ctx, monitor.Subscribe()) })
//
// Failed sends are retried, not returned: Run returns nil when ctx ends.
func (p *Publisher) Run(ctx context.Context, sub *health.Subscription) error {
	for {
		if u, ok := sub.Next(); ok {
			p.Update(u.Snapshot)
		}
		_ = p.Flush(ctx) // logged, counted and retried by the publisher
		timer := p.opts.Clock.NewTimer(max(p.NextAttempt().Sub(p.opts.Clock.Now()), 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-sub.C():
		case <-timer.C():
		}
		timer.Stop()
	}
}

// RebootActionFor returns the reboot action for the machine whose /proc/cpuinfo is cpuinfo:
// RESTART_VM when the CPU has the hypervisor flag (the kernel runs in a virtual machine),
// RESTART_BM otherwise or when cpuinfo cannot be read.
func RebootActionFor(cpuinfo io.Reader) datamodels.RecommendedAction {
	sc := bufio.NewScanner(cpuinfo)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(name) == "flags" && slices.Contains(strings.Fields(value), "hypervisor") {
			return datamodels.RecommendedAction_RESTART_VM
		}
	}
	return datamodels.RecommendedAction_RESTART_BM
}
