package evict

import (
	corev1 "k8s.io/api/core/v1"
)

// The Kubernetes Events the Evictor records, each once: a long-running agent does not repeat
// itself every round.

// noticeNode records a Node Event once per distinct message.
func (e *Evictor) noticeNode(eventType, reason, msg string) {
	key := "node/" + reason + "/" + msg
	if e.noticed[key] {
		return
	}
	e.noticed[key] = true
	e.opts.Recorder.Event(e.opts.NodeRef, eventType, reason, msg)
}

// noticePod records a pod Event once per pod and reason.
func (e *Evictor) noticePod(pod *corev1.Pod, eventType, reason, msg string) {
	key := string(pod.UID) + "/" + reason
	if e.noticed[key] {
		return
	}
	e.noticed[key] = true
	e.opts.Recorder.Event(pod, eventType, reason, msg)
}
