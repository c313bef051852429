package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Dump writes, as YAML without managedFields, the cluster's Nodes, ResourceSlices,
// DeviceTaintRules, DeviceClasses, ResourceClaims and Pods, then all Events one per line, oldest
// first. It keeps going past errors and returns them joined.
func (c *Cluster) Dump(ctx context.Context, w io.Writer) error {
	cs := c.adminClient
	all := metav1.ListOptions{}
	var errs []error
	sections := []struct {
		kind string
		list func() ([]metav1.Object, error)
	}{
		{"Nodes", func() ([]metav1.Object, error) {
			l, err := cs.CoreV1().Nodes().List(ctx, all)
			return items(err, func() []corev1.Node { return l.Items })
		}},
		{"ResourceSlices", func() ([]metav1.Object, error) {
			l, err := cs.ResourceV1().ResourceSlices().List(ctx, all)
			return items(err, func() []resourcev1.ResourceSlice { return l.Items })
		}},
		{"DeviceTaintRules", func() ([]metav1.Object, error) {
			l, err := cs.ResourceV1().DeviceTaintRules().List(ctx, all)
			return items(err, func() []resourcev1.DeviceTaintRule { return l.Items })
		}},
		{"DeviceClasses", func() ([]metav1.Object, error) {
			l, err := cs.ResourceV1().DeviceClasses().List(ctx, all)
			return items(err, func() []resourcev1.DeviceClass { return l.Items })
		}},
		{"ResourceClaims", func() ([]metav1.Object, error) {
			l, err := cs.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, all)
			return items(err, func() []resourcev1.ResourceClaim { return l.Items })
		}},
		{"Pods", func() ([]metav1.Object, error) {
			l, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, all)
			return items(err, func() []corev1.Pod { return l.Items })
		}},
	}
	for _, sec := range sections {
		objs, err := sec.list()
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s: %w", sec.kind, err))
			continue
		}
		fmt.Fprintf(w, "===== %s (%d) =====\n", sec.kind, len(objs))
		for _, obj := range objs {
			obj.SetManagedFields(nil)
			out, err := yaml.Marshal(obj)
			if err != nil {
				errs = append(errs, fmt.Errorf("marshal %s %s: %w", sec.kind, obj.GetName(), err))
				continue
			}
			fmt.Fprintf(w, "---\n%s", out)
		}
	}

	events, err := cs.CoreV1().Events(metav1.NamespaceAll).List(ctx, all)
	if err != nil {
		errs = append(errs, fmt.Errorf("list Events: %w", err))
	} else {
		fmt.Fprintf(w, "===== Events (%d) =====\n", len(events.Items))
		items := events.Items
		slices.SortStableFunc(items, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
		for _, e := range items {
			fmt.Fprintf(w, "%s %-7s %-28s %s/%s/%s (%s): %s\n",
				eventTime(e).Format("15:04:05.000"), e.Type, e.Reason,
				e.InvolvedObject.Kind, e.InvolvedObject.Namespace, e.InvolvedObject.Name,
				eventSource(e), strings.TrimSpace(e.Message))
		}
	}
	return errors.Join(errs...)
}

// items returns the items of a typed list as metav1.Objects; the list is only touched when err
// is nil.
func items[T any, PT interface {
	*T
	metav1.Object
}](err error, get func() []T) ([]metav1.Object, error) {
	if err != nil {
		return nil, err
	}
	list := get()
	out := make([]metav1.Object, 0, len(list))
	for i := range list {
		out = append(out, PT(&list[i]))
	}
	return out, nil
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	default:
		return e.CreationTimestamp.Time
	}
}

func eventSource(e corev1.Event) string {
	if e.ReportingController != "" {
		return e.ReportingController
	}
	return e.Source.Component
}
