package extender

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
)

// Filter answers one filter call.
func (s *Server) Filter(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	if args.Pod == nil {
		return &extenderv1.ExtenderFilterResult{Error: "request has no pod"}
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(args.Pod))
	req := scheduling.PodRequest(args.Pod)
	var (
		result  *extenderv1.ExtenderFilterResult
		retryOn []string
	)
	s.state.read(func(v view) { result, retryOn = s.filter(logger, v, args, req) })
	if s.requeue != nil && args.NodeNames != nil && args.Pod.UID != "" && args.Pod.Spec.NodeName == "" {
		s.requeue.remember(args.Pod.UID, args.Pod.Namespace, args.Pod.Name, retryOn)
	}
	if result.Error == "" {
		s.metrics.filtered.WithLabelValues("failed").Add(float64(len(result.FailedNodes)))
		s.metrics.filtered.WithLabelValues("passed").Add(float64(passed(result)))
		logger.V(4).Info("Filtered", "request", req, "failed", len(result.FailedNodes))
	}
	return result
}

// passed counts the nodes a filter result keeps.
func passed(result *extenderv1.ExtenderFilterResult) int {
	switch {
	case result.NodeNames != nil:
		return len(*result.NodeNames)
	case result.Nodes != nil:
		return len(result.Nodes.Items)
	}
	return 0
}

// filter is Filter against one view of the state. retryOn lists the nodes named in the request
// that GPU health (or a node missing from the cache) ruled out, when Options.Requeue is on: the
// pod is worth retrying when one of them gets better. With Node objects in the request the
// extender judges the scheduler's own view of the nodes, so the scheduler's own Node events
// already retry the pod, and nothing is collected.
func (s *Server) filter(logger klog.Logger, v view, args *extenderv1.ExtenderArgs, req scheduling.Request) (result *extenderv1.ExtenderFilterResult, retryOn []string) {
	failed := extenderv1.FailedNodesMap{}
	result = &extenderv1.ExtenderFilterResult{FailedNodes: failed}
	switch {
	case args.NodeNames != nil:
		names := make([]string, 0, len(*args.NodeNames))
		var scratch []scheduling.GPU
		for _, name := range *args.NodeNames {
			node, _ := v.node(name, nil)
			if node == nil {
				failed[name] = "node is not in the gpuhealth extender's cache yet"
				if s.requeue != nil {
					retryOn = append(retryOn, name)
				}
				continue
			}
			used := v.usage(name)
			if fits, reason := scheduling.Filter(req, node, used); !fits {
				failed[name] = reason
				if s.requeue != nil && healthBlocks(req, node, used, &scratch) {
					retryOn = append(retryOn, node.Name) // the cache's string, shared by all pods
				}
				continue
			}
			names = append(names, name)
		}
		result.NodeNames = &names
	case args.Nodes != nil:
		kept := &corev1.NodeList{Items: make([]corev1.Node, 0, len(args.Nodes.Items))}
		for i := range args.Nodes.Items {
			n := &args.Nodes.Items[i]
			node, warnings := v.node(n.Name, n)
			for _, w := range warnings {
				logger.V(2).Info("Ignoring part of a GPU health annotation", "node", klog.KObj(n), "warning", w)
			}
			if fits, reason := scheduling.Filter(req, node, v.usage(n.Name)); !fits {
				failed[n.Name] = reason
				continue
			}
			kept.Items = append(kept.Items, *n)
		}
		result.Nodes = kept
	default:
		return &extenderv1.ExtenderFilterResult{Error: "request has neither Nodes nor NodeNames"}, nil
	}
	return result, retryOn
}

// Prioritize scores each candidate node 0..10 (extenderv1.MaxExtenderPriority).
func (s *Server) Prioritize(ctx context.Context, args *extenderv1.ExtenderArgs) (extenderv1.HostPriorityList, error) {
	if args.Pod == nil {
		return nil, errors.New("request has no pod")
	}
	if args.NodeNames == nil && args.Nodes == nil {
		return nil, errors.New("request has neither Nodes nor NodeNames")
	}
	req := scheduling.PodRequest(args.Pod)
	var list extenderv1.HostPriorityList
	s.state.read(func(v view) {
		score := func(name string, n *corev1.Node) {
			node, _ := v.node(name, n)
			var sc int64
			if node != nil {
				sc = scheduling.Score(req, node, v.usage(name))
			}
			list = append(list, extenderv1.HostPriority{Host: name, Score: sc})
		}
		if args.NodeNames != nil {
			list = make(extenderv1.HostPriorityList, 0, len(*args.NodeNames))
			for _, name := range *args.NodeNames {
				score(name, nil)
			}
			return
		}
		list = make(extenderv1.HostPriorityList, 0, len(args.Nodes.Items))
		for i := range args.Nodes.Items {
			score(args.Nodes.Items[i].Name, &args.Nodes.Items[i])
		}
	})
	klog.FromContext(ctx).V(4).Info("Prioritized", "pod", klog.KObj(args.Pod), "request", req, "scores", list)
	return list, nil
}
