// Package gpu holds what GPU backends offer besides their signals. Each backend lives in a
// package below this one (nvml, sim, kmsg).
package gpu

import "context"

// Resetter resets one GPU. Reset returns once the reset is done, or with what went wrong; after
// a successful reset the backend's signal stream reports it (health.SignalReset for the GPU), as
// it does a reset someone else made, so the health library clears what a reset clears. A GPU
// must not be reset while work runs on it: the caller checks.
type Resetter interface {
	Reset(ctx context.Context, uuid string) error
}
