package nvml_test

import (
	"errors"
	"slices"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

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
