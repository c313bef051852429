package deviceplugin

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ReplicaSeparator joins a GPU UUID and a replica number in the device ID of a time-sliced GPU
// ("<UUID>::<n>"), as NVIDIA's device plugin names replicas, so tools that read device IDs from
// the kubelet's pod-resources API see the same shape with either plugin.
const ReplicaSeparator = "::"

// MaxReplicas bounds Options.Replicas: the kubelet keeps every advertised ID in memory and in its
// checkpoint.
const MaxReplicas = 64

// ReplicaID is the device ID of replica n of the GPU with this UUID.
func ReplicaID(uuid string, n int) string { return uuid + ReplicaSeparator + strconv.Itoa(n) }

// GPUOf returns the UUID a device ID stands for: the ID itself, or the UUID part of a replica ID.
func GPUOf(id string) string {
	uuid, _, _ := strings.Cut(id, ReplicaSeparator)
	return uuid
}

// ValidateReplicas checks a replica count: 1 (no sharing) up to MaxReplicas.
func ValidateReplicas(n int) error {
	if n < 1 || n > MaxReplicas {
		return fmt.Errorf("replicas: want 1 (no sharing) to %d, got %d", MaxReplicas, n)
	}
	return nil
}

// deviceIDs returns the IDs advertised for a GPU: its UUID, or one replica ID per replica.
func (o Options) deviceIDs(uuid string) []string {
	if o.Replicas <= 1 {
		return []string{uuid}
	}
	ids := make([]string, o.Replicas)
	for i := range ids {
		ids[i] = ReplicaID(uuid, i)
	}
	return ids
}

// gpusOf maps device IDs to the GPUs they stand for, each once, in first-seen order: a container
// given two replicas of one GPU sees that GPU once.
func gpusOf(ids []string) []string {
	var out []string
	for _, id := range ids {
		if uuid := GPUOf(id); !slices.Contains(out, uuid) {
			out = append(out, uuid)
		}
	}
	return out
}
