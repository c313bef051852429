package simdriver

import (
	"errors"
	"fmt"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// CheckScenario refuses what a driver cannot serve: kernel-log lines (the agent reads the kernel
// log itself), node reboots (a driver cannot reboot its node) and peer nodes' faults.
func CheckScenario(sc *sim.Scenario) error {
	if sc == nil {
		return errors.New("no scenario")
	}
	if len(sc.Missing) > 0 {
		// NVML would number the GPUs it answers for anew, and the PCI bus the agent compares
		// with is the machine's own: a missing GPU is tried with the sim backend and a sysfs tree.
		return errors.New("gpus.missing: the simulated driver serves every GPU of its scenario; use the sim backend (or inventory.sysfsRoot) for missing GPUs")
	}
	for _, ev := range append(append([]sim.Event{}, sc.Events...), sc.AfterReset...) {
		if err := checkEvent(ev); err != nil {
			return err
		}
	}
	return nil
}

func checkEvent(ev sim.Event) error {
	switch ev.Kind {
	case sim.EventKmsg:
		return fmt.Errorf("line %d: kmsg: the simulated driver serves NVML, not the kernel log (the agent reads the node's own)", ev.Line)
	case sim.EventReboot:
		return fmt.Errorf("line %d: reboot: a driver cannot reboot its node (restart the simulator instead)", ev.Line)
	case sim.EventPeerFault:
		return fmt.Errorf("line %d: peerFault: a driver knows nothing of other nodes (the agent reads its peers' reports)", ev.Line)
	}
	return nil
}
