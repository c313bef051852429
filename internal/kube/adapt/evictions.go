package adapt

import (
	"context"

	policyv1 "k8s.io/api/policy/v1"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

var _ kube.Evicter = clientset{}

// Evict implements kube.Evicter through client-go's policy/v1 client.
func (c clientset) Evict(ctx context.Context, eviction *policyv1.Eviction) error {
	return c.cs.PolicyV1().Evictions(eviction.Namespace).Evict(ctx, eviction)
}
