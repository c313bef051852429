package v1

import (
	"strconv"
	"strings"
)

// The annotations a GPU-sharing pod carries: the card it runs on, by index as Volcano records
// it, and by UUID as gpuhealth's extender adds it (a UUID survives index shifts). The extender
// writes them when it binds; placement charges the pod's memory to the card, and the evictor
// finds the pods of a card by them.
const (
	// PodGPUIndexKey names the card (NVML index) a GPU-sharing pod runs on: "2", or a list
	// "0,1" for a pod spread over cards.
	PodGPUIndexKey = "volcano.sh/gpu-index"
	// PodGPUUUIDKey names the same card by UUID.
	PodGPUUUIDKey = "gpuhealth.dev/gpu-uuid"
)

// MaxGPUsPerNode bounds a GPU index or count read from a node or a pod, so that a corrupt value
// cannot make a reader allocate without limit or match a card that cannot exist. Real nodes have
// at most a few dozen (MIG instances counted as nvidia.com/gpu included).
const MaxGPUsPerNode = 1024

// ReadPodCards reads a pod's PodGPUIndexKey: the card indexes it runs on, in the order written.
// present is false when the pod has no such annotation; ok is false when a part is no card index
// (each must be 0 to MaxGPUsPerNode-1), and then no card is returned: the caller says what it
// does with such a pod.
func ReadPodCards(annotations map[string]string) (cards []int, present, ok bool) {
	v, present := annotations[PodGPUIndexKey]
	if !present {
		return nil, false, false
	}
	for part := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 0 || n >= MaxGPUsPerNode {
			return nil, true, false
		}
		cards = append(cards, n)
	}
	return cards, true, true
}
