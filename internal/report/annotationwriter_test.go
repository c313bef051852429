package report_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report"
)

func node(rv, value string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: rv, Annotations: map[string]string{"k": value}}}
}

// TestWriteMergedMergesAgainOnConflict: the conditional patch carries the Node's resourceVersion;
// when the API server refuses it (another writer came between), the Node is read again and the
// merge runs on what that writer wrote. (The real API server's refusal is in test/e2e,
// TestSharedListsLoseNoConcurrentWrite.)
func TestWriteMergedMergesAgainOnConflict(t *testing.T) {
	client := fake.NewClientset(node("1", "theirs"))
	conflicts := 0
	var bodies []string
	client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		bodies = append(bodies, string(p.GetPatch()))
		if conflicts == 0 {
			conflicts++
			// Another writer changed the Node after it was read.
			n := node("2", "theirs,more")
			if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, ""); err != nil {
				t.Fatal(err)
			}
			return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), "n1", errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	c := nodecache.New(adapt.Clientset(client), "n1")
	w := report.NewAnnotationWriter(adapt.Clientset(client), c, "k")
	n, err := c.Get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var merged []string
	writes, err := w.WriteMerged(t.Context(), n, func(n *corev1.Node) (map[string]string, error) {
		merged = append(merged, n.Annotations["k"])
		return map[string]string{"k": n.Annotations["k"] + ",ours"}, nil
	})
	if err != nil || writes != 1 || w.Conflicts() != 1 {
		t.Fatalf("WriteMerged = %d writes, %v; %d conflicts", writes, err, w.Conflicts())
	}
	if len(merged) != 2 || merged[1] != "theirs,more" {
		t.Errorf("merged on %q, want the second merge on the other writer's value", merged)
	}
	if len(bodies) != 2 || !strings.Contains(bodies[0], `"resourceVersion":"1"`) || !strings.Contains(bodies[1], `"resourceVersion":"2"`) {
		t.Errorf("patches %q, want each conditional on the resourceVersion read", bodies)
	}
	got, _ := client.CoreV1().Nodes().Get(t.Context(), "n1", metav1.GetOptions{})
	if got.Annotations["k"] != "theirs,more,ours" {
		t.Errorf("k = %q", got.Annotations["k"])
	}
}
