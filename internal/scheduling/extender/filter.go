package extender

import (
	"context"
	"errors"
	"strconv"

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
		s.metrics.filteredFailed.Add(float64(len(result.FailedNodes)))
		s.metrics.filteredPassed.Add(float64(passed(result)))
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
		j := s.judgeNow(&scheduling.Judge{})
		for _, name := range *args.NodeNames {
			node, used := v.cached(name)
			fits, reason, retry := s.judge(j, req, node, used)
			switch {
			case fits:
				names = append(names, name)
				continue
			case retry && node != nil:
				retryOn = append(retryOn, node.Name) // the cache's string, shared by all pods
			case retry:
				retryOn = append(retryOn, name)
			}
			failed[name] = reason
		}
		result.NodeNames = &names
	case args.Nodes != nil:
		kept := &corev1.NodeList{Items: make([]corev1.Node, 0, len(args.Nodes.Items))}
		// The scheduler's own Node events retry the pod (see above): no verdict is explained.
		j := &scheduling.Judge{Now: s.opts.Clock.Now(), StaleAfter: s.opts.StaleAfter}
		for i := range args.Nodes.Items {
			n := &args.Nodes.Items[i]
			node, warnings := v.node(n.Name, n)
			for _, w := range warnings {
				logger.V(2).Info("Ignoring part of a GPU health annotation", "node", klog.KObj(n), "warning", w)
			}
			if verdict := j.Node(req, node, v.usage(n.Name)); !verdict.Fits {
				failed[n.Name] = verdict.Reason
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

// filterNamed is Filter for a request that names the nodes (nodeCacheCapable: true), as
// parseNamesArgs read it, with a pod. It returns the reply, the ExtenderFilterResult as JSON,
// built in b: the same reply as Filter's through encoding/json, except that FailedNodes lists the
// nodes in the request's order (encoding/json sorts a map's keys; a JSON object has no order).
func (s *Server) filterNamed(ctx context.Context, pod *corev1.Pod, names [][]byte, b *filterBuffers) []byte {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	req := scheduling.PodRequest(pod)
	const head = `{"Nodes":null,"NodeNames":[`
	fit, failed := append(b.fit[:0], head...), b.failed[:0]
	var retryOn []string
	nfailed := 0
	j := s.judgeNow(&b.judge)
	s.state.read(func(v view) {
		for _, name := range names {
			node, used := v.cachedBytes(name)
			fits, reason, retry := s.judge(j, req, node, used)
			switch {
			case fits:
				if len(fit) > len(head) {
					fit = append(fit, ',')
				}
				fit = appendJSONString(fit, name)
				continue
			case retry && node != nil:
				retryOn = append(retryOn, node.Name) // the cache's string, shared by all pods
			case retry:
				retryOn = append(retryOn, string(name))
			}
			if nfailed > 0 {
				failed = append(failed, ',')
			}
			nfailed++
			failed = appendJSONString(failed, name)
			failed = append(failed, ':')
			failed = append(failed, b.quoted(reason)...)
		}
	})
	if s.requeue != nil && pod.UID != "" && pod.Spec.NodeName == "" {
		s.requeue.remember(pod.UID, pod.Namespace, pod.Name, retryOn)
	}
	s.metrics.filteredFailed.Add(float64(nfailed))
	s.metrics.filteredPassed.Add(float64(len(names) - nfailed))
	logger.V(4).Info("Filtered", "request", req, "failed", nfailed)
	out := append(fit, `],"FailedNodes":{`...)
	out = append(out, failed...)
	out = append(out, "},\"FailedAndUnresolvableNodes\":null,\"Error\":\"\"}\n"...)
	b.fit, b.failed = out, failed
	return out
}

// prioritizeNamed is Prioritize for a request that names the nodes, as parseNamesArgs read it,
// with a pod. It returns the reply, the HostPriorityList as JSON, built in b: the same reply as
// Prioritize's through encoding/json.
func (s *Server) prioritizeNamed(ctx context.Context, pod *corev1.Pod, names [][]byte, b *filterBuffers) []byte {
	req := scheduling.PodRequest(pod)
	out := append(b.fit[:0], '[')
	s.state.read(func(v view) {
		for i, name := range names {
			var score int64
			if node, used := v.cachedBytes(name); node != nil {
				score = b.judge.Score(req, node, used)
			}
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, `{"Host":`...)
			out = appendJSONString(out, name)
			out = append(out, `,"Score":`...)
			out = strconv.AppendInt(out, score, 10)
			out = append(out, '}')
		}
	})
	out = append(out, "]\n"...)
	b.fit = out
	klog.FromContext(ctx).V(4).Info("Prioritized", "pod", klog.KObj(pod), "request", req, "nodes", len(names))
	return out
}

// notCached is the reason given for a node the extender has not seen (yet).
const notCached = "node is not in the gpuhealth extender's cache yet"

// judge is the verdict on one node named in a request, from the cache (node is nil when the cache
// does not have it): whether the pod fits, and if not why, and whether the pod is to be retried
// when the node gets better (Options.Requeue, and GPU health or the cache's lag is to blame).
// The calls of one request share j, which judgeNow set up.
func (s *Server) judge(j *scheduling.Judge, req scheduling.Request, node *scheduling.NodeGPUs, used scheduling.Usage) (fits bool, reason string, retry bool) {
	if node == nil {
		return false, notCached, s.requeue != nil
	}
	v := j.Node(req, node, used)
	return v.Fits, v.Reason, v.HealthBlocks
}

// judgeNow readies j for a request that arrives now: every node's staleness is judged at the
// same time, and with Options.Requeue a verdict says whether GPU health is to blame.
func (s *Server) judgeNow(j *scheduling.Judge) *scheduling.Judge {
	j.Now, j.StaleAfter, j.Explain = s.opts.Clock.Now(), s.opts.StaleAfter, s.requeue != nil
	return j
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
