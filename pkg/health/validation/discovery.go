package validation

import (
	"bufio"
	"bytes"
	"errors"
	"regexp"
	"strconv"
	"strings"
)

// `dcgmi discovery -l` prints the GPUs its host engine knows as a table, one block per GPU:
//
//	8 GPUs found.
//	+--------+----------------------------------------------------------------------+
//	| GPU ID | Device Information                                                   |
//	+--------+----------------------------------------------------------------------+
//	| 0      | Name: NVIDIA H100 80GB HBM3                                          |
//	|        | PCI Bus ID: 00000000:18:00.0                                         |
//	|        | Device UUID: GPU-6b1c9fe2-...                                        |
//	+--------+----------------------------------------------------------------------+
//
// followed by NvSwitches (and, in 4.x, CPUs) in tables of their own, whose rows carry no GPU
// UUID.
var (
	discoveryID   = regexp.MustCompile(`^\|\s*(\d+)\s*\|`)
	discoveryUUID = regexp.MustCompile(`Device UUID:\s*(GPU-[0-9A-Fa-f-]+)`)
)

// ParseDCGMDiscovery reads `dcgmi discovery -l`'s table into DCGM's GPU id by UUID (upper
// case). A table with no GPU, or a GPU's UUID listed under two ids, is an error.
func ParseDCGMDiscovery(out []byte) (map[string]int, error) {
	ids := map[string]int{}
	current := -1
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := discoveryID.FindStringSubmatch(line); m != nil {
			n, err := strconv.Atoi(m[1])
			if err != nil {
				return nil, err
			}
			current = n
		}
		if strings.HasPrefix(line, "+") && strings.Contains(line, "-+-") {
			continue
		}
		if m := discoveryUUID.FindStringSubmatch(line); m != nil {
			if current < 0 {
				return nil, errors.New("dcgmi discovery -l: a Device UUID before any GPU ID")
			}
			uuid := strings.ToUpper(m[1])
			if prev, ok := ids[uuid]; ok && prev != current {
				return nil, errors.New("dcgmi discovery -l lists " + m[1] + " twice, as GPU " + strconv.Itoa(prev) + " and " + strconv.Itoa(current))
			}
			ids[uuid] = current
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("dcgmi discovery -l lists no GPU with its UUID: " + excerpt(out, 200))
	}
	return ids, nil
}
