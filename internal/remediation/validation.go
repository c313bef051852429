package remediation

import (
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/validation"
)

// What the Machine offers and needs for validations: the verdicts of the tests its
// ValidationEnv runs, operators' requests, and the GPUs to validate after a reboot.

// ValidationEnv runs validations; an Env without it cannot validate (every run is an error).
type ValidationEnv interface {
	// StartValidation starts the active test of the GPU and returns at once; the verdict comes
	// back through Machine.ValidationFinished.
	StartValidation(dev health.Device)
}

// verdict is a validation's verdict and how long it took.
type verdict struct {
	validation.Verdict
	took time.Duration
}

// ValidationFinished hands the verdict of a validation started by ValidationEnv to the machine.
func (m *Machine) ValidationFinished(uuid string, v validation.Verdict, took time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.verdicts[uuid] = verdict{v, took}
	if m.validating == uuid {
		m.validating = ""
	}
}

// RequestValidation asks for a validation of the GPU (an operator's request; why says who and
// why); the next Step applies it.
func (m *Machine) RequestValidation(uuid, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests[uuid] = why
}

// ValidateAfterReboot puts the GPUs (by UUID) that had a fault pending when the node rebooted
// into a validation before they are offered again, unless a repair of this boot already holds
// them; the first Step says so in an Event. Call it before the first Step.
func (m *Machine) ValidateAfterReboot(uuids []string) {
	now := m.clock.Now()
	for _, uuid := range uuids {
		if m.gpus[uuid].Phase != PhaseIdle {
			continue
		}
		m.gpus[uuid] = State{Phase: PhaseWaitingForPods, Since: now, FaultSince: now, ValidateOnly: true, Requested: "after a reboot",
			Fault: "validation after a reboot", Message: "to be validated before it goes back into service: it had a fault when the node rebooted"}
		m.announce[uuid] = "the GPU had a fault when the node rebooted: it is kept out of service until a validation passes"
	}
	m.publish()
}

// startValidation starts a validation unless one runs on the node; it reports whether it did.
func (m *Machine) startValidation(dev health.Device) bool {
	m.mu.Lock()
	if m.validating != "" {
		m.mu.Unlock()
		return false
	}
	m.validating = dev.UUID
	m.mu.Unlock()
	if ve, ok := m.env.(ValidationEnv); ok {
		ve.StartValidation(dev)
		return true
	}
	m.ValidationFinished(dev.UUID, validation.Verdict{Result: validation.Error, Message: "this agent cannot run validations"}, 0)
	return true
}

// validationRunning returns the GPU whose validation runs on the node, "" when none.
func (m *Machine) validationRunning() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.validating
}
