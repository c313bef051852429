package nvml_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// recorder is a Sink that keeps everything.
type recorder struct {
	mu          sync.Mutex
	signals     []health.Signal
	unmonitored map[string]bool
}

func newRecorder() *recorder { return &recorder{unmonitored: map[string]bool{}} }

func (r *recorder) Signal(s health.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signals = append(r.signals, s)
}

func (r *recorder) SetUnmonitored(uuid string, unmonitored bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unmonitored[uuid] = unmonitored
}

// take returns and forgets the signals so far.
func (r *recorder) take() []health.Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.signals
	r.signals = nil
	return s
}

func (r *recorder) isUnmonitored(uuid string) (unmonitored, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	unmonitored, known = r.unmonitored[uuid]
	return
}

// waitSignals waits until the recorder holds a signal matching last, and returns everything
// recorded so far (and forgets it).
func (r *recorder) waitSignals(t *testing.T, what string, last func(health.Signal) bool) []health.Signal {
	t.Helper()
	var got []health.Signal
	healthtest.Eventually(t, what, func() bool {
		got = append(got, r.take()...)
		return slices.ContainsFunc(got, last)
	})
	return got
}

func isKind(kind health.SignalKind, uuid string) func(health.Signal) bool {
	return func(s health.Signal) bool { return s.Kind == kind && s.Device == uuid }
}

// without drops the signals of the given kinds (sampling rounds are noise in event tests).
func without(sigs []health.Signal, kinds ...health.SignalKind) []health.Signal {
	return slices.DeleteFunc(slices.Clone(sigs), func(s health.Signal) bool { return slices.Contains(kinds, s.Kind) })
}

var errNotFound = errors.New("not found")

// deviceStatus finds a device in a snapshot.
func deviceStatus(snap health.Snapshot, uuid string) (health.DeviceStatus, error) {
	for _, d := range snap.Devices {
		if d.Device.UUID == uuid {
			return d, nil
		}
	}
	return health.DeviceStatus{}, errNotFound
}
