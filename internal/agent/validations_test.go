package agent

import (
	"context"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// A validation request on a node whose agent does not validate, or for a GPU it does not have,
// is answered with a Warning and removed; a malformed one is left alone.
func TestValidationRequestsWithoutValidation(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        []string
		removed     bool
	}{
		{"not configured", `{"GPU-b":{"index":1,"reason":"after RMA","by":"alice"}}`,
			[]string{"Warning GPUValidationNotConfigured GPU 1 (GPU-b): gpuhealth cannot validate it: remediation.validation is not enabled on this node (request by alice: after RMA)"}, true},
		{"a GPU this node does not have, and a MIG instance", `{"GPU-gone":{"index":5,"reason":"r","by":"alice"},"MIG-b1":{"index":1,"reason":"r","by":"bob"}}`,
			[]string{"this node has no GPU GPU-gone (request by alice: r)", "this node has no GPU MIG-b1 (request by bob: r)"}, true},
		{"malformed", `{"GPU-b":{"index":1,"by":"alice"}}`, []string{"Warning MalformedValidationRequests gpuhealth applied none of the validation requests and left them on the Node"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newClearFixture(t, "")
			ctx := klog.NewContext(context.Background(), klog.Background())
			if _, err := f.client.CoreV1().Nodes().Patch(ctx, "n1", "application/merge-patch+json",
				[]byte(`{"metadata":{"annotations":{"`+gpuhealthv1.ValidationRequestsKey+`":`+strconv.Quote(tc.value)+`}}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			w := &requestWatcher{nodes: f.w.nodes, client: f.w.client, clock: f.clock, recorder: f.recorder, nodeRef: &corev1.ObjectReference{Kind: "Node", Name: "n1"},
				kind: validationRequests(nil, f.monitor, f.recorder, &corev1.ObjectReference{Kind: "Node", Name: "n1"})}
			if err := w.sync(ctx); err != nil {
				t.Fatal(err)
			}
			events := f.events()
			if len(events) != len(tc.want) {
				t.Fatalf("events %q, want %d like %q", events, len(tc.want), tc.want)
			}
			for i, want := range tc.want {
				if !strings.Contains(events[i], want) {
					t.Errorf("event %q does not say %q", events[i], want)
				}
			}
			if _, present := f.annotations(t)[gpuhealthv1.ValidationRequestsKey]; present == tc.removed {
				t.Errorf("requests present %v after the sync, want removed %v", present, tc.removed)
			}
		})
	}
}
