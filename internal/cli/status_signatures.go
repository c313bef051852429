package cli

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/fleet/watch"
)

// SignatureReasonPrefix marks, in a GPU's reasons, the workload whose signature its recent fault
// is: the breaker controller's judge (fleet.sharedCauses) found that fault on many of the
// workload's GPUs at once, the workload's doing rather than the card's.
const SignatureReasonPrefix = "signature:"

// addWorkloadSignatures marks the GPUs the controller's verdict (the ConfigMap
// gpuhealth-fleet-findings in namespace) names in a workload signature. No verdict (the judge off,
// or not readable) marks nothing; a verdict that does not parse is said once.
func addWorkloadSignatures(ctx context.Context, client kubernetes.Interface, namespace string, gpus []GPUStatus) {
	logger := klog.FromContext(ctx)
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, watch.ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		logger.V(2).Info("Not marking workload signatures: the fleet's verdict cannot be read", "err", err)
		return
	}
	f, err := watch.ParseFindings(cm)
	if err != nil {
		logger.Info("Warning: not marking workload signatures", "err", err)
		return
	}
	markSignatures(gpus, f.Signatures)
}

// markSignatures sets each named GPU's WorkloadSignature and adds it to its reasons.
func markSignatures(gpus []GPUStatus, signatures []watch.Signature) {
	of := map[string]string{}
	for _, s := range signatures {
		for _, uuid := range s.GPUs {
			of[uuid] = s.Workload
		}
	}
	for i := range gpus {
		if w, ok := of[gpus[i].UUID]; ok {
			gpus[i].WorkloadSignature = w
			gpus[i].Reasons = append(gpus[i].Reasons, SignatureReasonPrefix+w)
		}
	}
}
