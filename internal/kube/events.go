package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// EventSink is client-go's record.EventSink over Interface: each Event goes to its own
// namespace, as with client-go's EventSinkImpl.
type EventSink struct {
	Client Interface
}

// Create implements record.EventSink.
func (s EventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	return s.Client.CoreV1().Events(e.Namespace).Create(context.Background(), e, metav1.CreateOptions{})
}

// Update implements record.EventSink.
func (s EventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	return s.Client.CoreV1().Events(e.Namespace).Update(context.Background(), e, metav1.UpdateOptions{})
}

// Patch implements record.EventSink.
func (s EventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	return s.Client.CoreV1().Events(e.Namespace).Patch(context.Background(), e.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
}
