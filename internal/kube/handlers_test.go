package kube

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func TestHandlersTypedAndTombstones(t *testing.T) {
	var set, del []string
	h := Handlers(func(n *corev1.Node) { set = append(set, n.Name) }, func(n *corev1.Node) { del = append(del, n.Name) })
	node := func(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }

	h.OnAdd(node("a"), false)
	h.OnUpdate(node("a"), node("b"))
	h.OnAdd(&corev1.Pod{}, false) // another type: passed over
	h.OnDelete(node("c"))
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "d", Obj: node("d")})
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "e", Obj: &corev1.Pod{}})

	if want := []string{"a", "b"}; !slices.Equal(set, want) {
		t.Errorf("set got %v, want %v", set, want)
	}
	if want := []string{"c", "d"}; !slices.Equal(del, want) {
		t.Errorf("del got %v, want %v", del, want)
	}
	if Handlers(func(*corev1.Node) {}, nil).DeleteFunc != nil {
		t.Error("a nil del registered a delete handler")
	}
}
