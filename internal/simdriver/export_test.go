package simdriver

import (
	"fmt"
	"net"
)

// hello opens a consumer's session on c as the library of driver profile version does, with pid
// as the process ID its HELLO gives.
func hello(c net.Conn, pid uint32, version string) error {
	h := request{Op: opHello, A: pid, B: wireVersion}
	copy(h.S[:], version)
	for _, req := range []request{h, {Op: opInit}} {
		resp, err := roundTrip(c, &req)
		if err != nil {
			return err
		}
		if resp.Ret != retSuccess {
			return fmt.Errorf("op %d answered %d", req.Op, resp.Ret)
		}
	}
	return nil
}

// FreeEventSetsAs connects to the simulator serving root as a library of driver profile version
// whose HELLO says it is process pid, and asks to free the event sets 1 to n: it returns how many
// the simulator freed.
func FreeEventSetsAs(root, version string, pid uint32, n int) (int, error) {
	c, err := net.Dial("unix", findSocket(root))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := hello(c, pid, version); err != nil {
		return 0, err
	}
	freed := 0
	for id := range n {
		resp, err := roundTrip(c, &request{Op: opEventSetFree, A: uint32(id + 1)})
		if err != nil {
			return freed, err
		}
		if resp.Ret == retSuccess {
			freed++
		}
	}
	return freed, nil
}
