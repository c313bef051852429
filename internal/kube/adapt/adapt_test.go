package adapt

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/util/watchlist"
)

func TestClientsetPassesCallsAndWatchListSupportThrough(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	c := Clientset(cs)
	if _, err := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	// client-go's fake cannot serve streaming lists; informers over the adapter must know.
	if !watchlist.DoesClientNotSupportWatchListSemantics(cs) {
		t.Fatal("precondition: the fake claims watch-list support")
	}
	if !watchlist.DoesClientNotSupportWatchListSemantics(c) {
		t.Error("the adapter hides that the fake cannot serve streaming lists")
	}
}
