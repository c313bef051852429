package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/fleet/watch"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
)

// fleetWatcher returns the judge of shared causes opts ask for (nil when off), posting its Events
// through a broadcaster that stop ends and setting the controller's fleet metrics.
func fleetWatcher(ctx context.Context, opts Options, m *breaker.ControllerMetrics) (*watch.Watcher, func(), error) {
	if opts.SharedCauses == nil {
		return nil, func() {}, nil
	}
	kc := adapt.Clientset(opts.Client)
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(kube.EventSink{Client: kc})
	w, err := watch.New(watch.Options{
		Settings: *opts.SharedCauses, Client: kc, Namespace: opts.Namespace, Driver: opts.Driver,
		Recorder:   broadcaster.NewRecorder(kube.Scheme, corev1.EventSource{Component: "gpuhealth-breaker-controller"}),
		Finding:    m.SetFleetFinding,
		Signatures: func(n int) { m.FleetSignatures.Set(float64(n)) },
		Judged:     func(at time.Time) { m.FleetJudged.Set(float64(at.Unix())) },
	})
	if err != nil {
		broadcaster.Shutdown()
		return nil, nil, err
	}
	return w, broadcaster.Shutdown, nil
}
