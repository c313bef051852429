package nodegpu

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
)

// OperatorPause follows the GPU operator's pause labels on a Node (the agent's and the device
// plugin's). Before it upgrades or restarts its driver container the operator pauses every GPU
// client through its nvidia.com/gpu.deploy.* labels; a process that holds a device file of the
// driver then keeps the kernel module from unloading, so both let go of NVML while it lasts.
type OperatorPause struct {
	node    func(context.Context) (*corev1.Node, error)
	changed chan struct{}
}

// PausedReasonPrefix starts every reason Reason gives.
const PausedReasonPrefix = "the GPU operator paused GPU clients"

// NewOperatorPause follows the labels of the Node that node reads. Whoever watches that Node
// calls Notify after each change of it (WatchOperatorPause does, for a Node cache).
func NewOperatorPause(node func(context.Context) (*corev1.Node, error)) *OperatorPause {
	return &OperatorPause{node: node, changed: make(chan struct{}, 1)}
}

// WatchOperatorPause registers on nodes (which the caller starts) and returns the watch.
func WatchOperatorPause(nodes *nodecache.Cache) (*OperatorPause, error) {
	p := NewOperatorPause(nodes.Get)
	err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.Notify() },
		UpdateFunc: func(any, any) { p.Notify() },
		DeleteFunc: func(any) { p.Notify() },
	})
	if err != nil {
		return nil, fmt.Errorf("watching the GPU operator's labels: %w", err)
	}
	return p, nil
}

// Notify says that the Node changed: Changes is signalled (once for any number of changes
// not yet received).
func (p *OperatorPause) Notify() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Reason says which of the operator's labels pause GPU clients now ("" when none does). A Node
// that cannot be read pauses nothing: the agent keeps doing what it does.
func (p *OperatorPause) Reason(ctx context.Context) string {
	reason, _ := p.Lookup(ctx)
	return reason
}

// Lookup is Reason, with the error when the Node cannot be read. A nil OperatorPause pauses
// nothing.
func (p *OperatorPause) Lookup(ctx context.Context) (string, error) {
	if p == nil {
		return "", nil
	}
	n, err := p.node(ctx)
	if err != nil {
		return "", err
	}
	pauses := remediation.OperatorPauses(n.Labels)
	if len(pauses) == 0 {
		return "", nil
	}
	return PausedReasonPrefix + " (" + strings.Join(pauses, ", ") + ")", nil
}

// Changes is signalled after every change of the Node (never, for a nil OperatorPause).
func (p *OperatorPause) Changes() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.changed
}
