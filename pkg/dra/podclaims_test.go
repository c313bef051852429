package dra

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func TestPodClaimNames(t *testing.T) {
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{
			{Name: "named", ResourceClaimName: ptr.To("shared-claim")},
			{Name: "templated", ResourceClaimTemplateName: ptr.To("gpu-template")},
		}},
		Status: corev1.PodStatus{
			ResourceClaimStatuses: []corev1.PodResourceClaimStatus{
				{Name: "templated", ResourceClaimName: ptr.To("pod-templated-x7k2")},
				{Name: "not-generated-yet"},
				{Name: "named", ResourceClaimName: ptr.To("shared-claim")},
			},
			ExtendedResourceClaimStatus: &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "pod-extended-9q"},
		},
	}
	want := []string{"pod-extended-9q", "pod-templated-x7k2", "shared-claim"}
	if got := PodClaimNames(pod); !slices.Equal(got, want) {
		t.Errorf("PodClaimNames = %v, want %v", got, want)
	}
	if got := PodClaimNames(&corev1.Pod{}); len(got) != 0 {
		t.Errorf("a pod without claims: %v", got)
	}
}
