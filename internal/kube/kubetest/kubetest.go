// Package kubetest has helpers for unit tests on client-go's fake clientset: what the real API
// server does that the fake does not. Acceptance tests run against a real API server instead.
package kubetest

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
)

// StampCreation makes client set creationTimestamp from clk on every object of resource it
// creates, as the API server does with its own clock (the fake leaves it zero).
func StampCreation(client *fake.Clientset, resource string, clk clock.PassiveClock) *fake.Clientset {
	client.PrependReactor("create", resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if obj, err := meta.Accessor(a.(k8stesting.CreateAction).GetObject()); err == nil {
			obj.SetCreationTimestamp(metav1.NewTime(clk.Now()))
		}
		return false, nil, nil
	})
	return client
}
