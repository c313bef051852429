package cli

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
)

// updateNodeAnnotation sets one annotation of a Node to what update makes of the Node, with
// optimistic concurrency: the patch carries the resourceVersion it read, and a conflict (someone
// changed the Node meanwhile) reads it again and calls update again, so that two operators'
// requests at once never lose one. update returns the new value (nil removes the annotation)
// and whether anything changed; an error of its own is returned as it is. A Node that does not
// exist is bad input.
func updateNodeAnnotation(ctx context.Context, client kubernetes.Interface, nodeName, key, fieldManager string,
	update func(node *corev1.Node) (value any, changed bool, err error)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return cmdutil.BadInput(fmt.Errorf("node %q not found", nodeName))
		}
		if err != nil {
			return err
		}
		value, changed, err := update(node)
		if err != nil || !changed {
			return err
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": node.ResourceVersion,
			"annotations":     map[string]any{key: value},
		}})
		if err != nil {
			return err
		}
		_, err = client.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
		return err
	})
}
