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

// requestAnnotation is an annotation of operators' requests about GPUs, keyed by UUID: its key,
// the field manager of the command that writes it, and its codec.
type requestAnnotation[M any] struct {
	key, fieldManager string
	parse             func(value string) (M, error)
	format            func(requests M) (string, error)
}

// addRequest resolves gpu on node from the agent's report (reportedGPU) and lets add put a
// request for it into the node's requests of annotation a, with optimistic concurrency
// (updateNodeAnnotation), so two requests at once never lose one. A GPU the agent does not
// report, one add refuses, or an annotation that does not parse changes nothing. It returns the
// GPU as the agent reports it.
func addRequest[M any](ctx context.Context, client kubernetes.Interface, nodeName, gpu string, a requestAnnotation[M],
	add func(requests M, target clearedGPU) error) (clearedGPU, error) {
	var target clearedGPU
	err := updateNodeAnnotation(ctx, client, nodeName, a.key, a.fieldManager, func(node *corev1.Node) (any, bool, error) {
		requests, err := a.parse(node.Annotations[a.key])
		if err != nil {
			return nil, false, fmt.Errorf("node %s: %w (fix or remove the annotation by hand)", nodeName, err)
		}
		if target, err = reportedGPU(node, gpu); err != nil {
			return nil, false, cmdutil.BadInput(err)
		}
		if err := add(requests, target); err != nil {
			return nil, false, err
		}
		value, err := a.format(requests)
		return value, true, err
	})
	return target, err
}
