package dra

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// PodClaimNames returns the names of the ResourceClaims a pod uses, sorted and without
// repeats: those it names, those generated for it from templates (in its status), and the one
// backing its DRA extended resources.
func PodClaimNames(pod *corev1.Pod) []string {
	var names []string
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			names = append(names, *rc.ResourceClaimName)
		}
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			names = append(names, *st.ResourceClaimName)
		}
	}
	if ext := pod.Status.ExtendedResourceClaimStatus; ext != nil && ext.ResourceClaimName != "" {
		names = append(names, ext.ResourceClaimName)
	}
	slices.Sort(names)
	return slices.Compact(names)
}
