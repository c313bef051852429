package sim

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// Board serial numbers: what names a physical GPU wherever it is plugged in. The simulated
// driver's nvmlDeviceGetSerial, the simulated dcgmi and the sim backend's health.Device all
// answer Scenario.Serial.

// MaxSerialLength bounds a serial a scenario gives: NVML's NVML_DEVICE_SERIAL_BUFFER_SIZE, "large
// enough for nvmlDeviceGetSerial", is 30 bytes with the terminating NUL, so no board's serial is
// longer, and a longer one would not pass through the simulated driver's nvmlDeviceGetSerial.
const MaxSerialLength = 29

// serialStemDigits and serialIndexDigits are the base-36 digits of a default serial that come
// from the node and from the GPU's index: 8 + 2 after "SIM", 13 characters as NVIDIA's serials.
const (
	serialStemDigits  = 8
	serialIndexDigits = 2
)

// DefaultSerial is the serial of simulated GPU index on node when the scenario gives none:
// "SIM", 8 base-36 digits (0-9, A-Z) of the FNV-64a hash of the node name, and the index in 2
// base-36 digits: 13 characters, as NVIDIA's serials (GPU 0 of sim-node-0 is SIM6GUV6KH200, its
// GPU 35 SIM6GUV6KH20Z). It is stable; it differs from every other GPU's of the node (the index is
// part of it, and MaxGPUs < 36²); and from every GPU's of another node unless the two nodes'
// digits agree, one chance in 36⁸ (2.8 × 10¹²) for two nodes, about one in 2,000 that any two of
// 50,000 nodes do. Ten decimal digits of a hash of node and index would hold 10¹⁰ values, and a
// fleet of 400,000 simulated GPUs would repeat some of them.
func DefaultSerial(node string, index int) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	stem := h.Sum64() % pow36(serialStemDigits)
	return "SIM" + base36(stem, serialStemDigits) + base36(uint64(index)%pow36(serialIndexDigits), serialIndexDigits)
}

// pow36 is 36ⁿ.
func pow36(n int) uint64 {
	p := uint64(1)
	for range n {
		p *= 36
	}
	return p
}

// base36 writes v in upper-case base 36, zero-padded to width digits.
func base36(v uint64, width int) string {
	s := strings.ToUpper(strconv.FormatUint(v, 36))
	return strings.Repeat("0", max(0, width-len(s))) + s
}

// Serial is the board serial of GPU index: the scenario's (gpus.serials) when it gives one,
// DefaultSerial of the node otherwise. A scenario replayed on another node (OnNode) keeps the
// serials it gives: its GPUs are then the same boards on every node that replays it, as if they
// had been moved; the default ones follow the node.
func (sc *Scenario) Serial(index int) string {
	if index >= 0 && index < len(sc.Serials) {
		return sc.Serials[index]
	}
	return DefaultSerial(sc.Node, index)
}

// parseSerials reads gpus.serials, once the GPUs' count is known: each a serial a board could
// have (NVML's length, ASCII letters, digits, '.', '_' and '-'), none twice. A serial for a GPU in
// gpus.missing is allowed and unused: the driver does not answer for that GPU.
func (sc *Scenario) parseSerials(serials []string) error {
	if len(serials) > sc.GPUCount {
		return fmt.Errorf("gpus.serials: %d serials for %d GPUs; give at most one per GPU, by index", len(serials), sc.GPUCount)
	}
	seen := make(map[string]int, len(serials))
	for j, s := range serials {
		if err := checkSerial(s); err != nil {
			return fmt.Errorf("gpus.serials[%d]: %w", j, err)
		}
		if k, dup := seen[s]; dup {
			return fmt.Errorf("gpus.serials[%d]: %q is GPU %d's serial already; each board has its own", j, s, k)
		}
		seen[s] = j
	}
	sc.Serials = serials
	return nil
}

// checkSerial says what makes s a serial no board has.
func checkSerial(s string) error {
	if s == "" {
		return fmt.Errorf("must not be empty (leave the list shorter: the GPUs after it take the default)")
	}
	if len(s) > MaxSerialLength {
		return fmt.Errorf("%.40q has %d characters, at most %d", s, len(s), MaxSerialLength)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isSerialChar(c) {
			return fmt.Errorf("%q has %q: only ASCII letters, digits, '.', '_' and '-'", s, c)
		}
	}
	return nil
}

func isSerialChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}
