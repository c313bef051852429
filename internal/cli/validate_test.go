package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// waitForValidation prints the verdict of the validation the request started, waits past a
// run that gave no verdict, and fails on a failed one, on a node that cannot validate and when
// no verdict comes in time.
func TestWaitForValidation(t *testing.T) {
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	req := gpuhealthv1.ValidationRequest{Index: 1, Reason: "after RMA", By: "carol", At: at}
	n := 0
	event := func(reason, msg string, when time.Time) *corev1.Event {
		n++
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "e" + strings.Repeat("x", n), Namespace: metav1.NamespaceDefault},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "n1"},
			Reason:         reason, Message: msg, LastTimestamp: metav1.NewTime(when),
		}
	}
	started := func(when time.Time) *corev1.Event {
		return event("GPURemediationStarted", "GPU 1 (GPU-b): validation requested "+req.Message()+": the GPU is kept out of service until it passes", when)
	}
	passed := "GPU 1 (GPU-b): the GPU passed its validation (2m0s): 3 tests passed"
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		want    string // on stdout
		wantErr string
	}{
		{"passed", []runtime.Object{started(at), event(gpuhealthv1.EventValidationPassed, passed, at.Add(2*time.Minute))}, "passed: " + passed, ""},
		{"no verdict, then a pass", []runtime.Object{started(at),
			event(gpuhealthv1.EventValidationError, "GPU 1 (GPU-b): could not validate the GPU: dcgmi exited 235", at.Add(time.Minute)),
			event(gpuhealthv1.EventValidationPassed, passed, at.Add(3*time.Minute))},
			"no verdict yet (the agent tries again): GPU 1 (GPU-b): could not validate the GPU: dcgmi exited 235\npassed: " + passed, ""},
		{"failed", []runtime.Object{started(at), event(gpuhealthv1.EventValidationFailed, "GPU 1 (GPU-b): the GPU failed its validation: memory: Fail", at.Add(time.Minute))},
			"", "failed: GPU 1 (GPU-b): the GPU failed its validation: memory: Fail"},
		{"an earlier verdict does not count", []runtime.Object{started(at), event(gpuhealthv1.EventValidationPassed, passed, at.Add(-time.Hour))},
			"", "no verdict for GPU GPU-b within"},
		{"the node does not validate", []runtime.Object{event(gpuhealthv1.EventValidationNotConfigured,
			"GPU 1 (GPU-b): gpuhealth cannot validate it: remediation.validation is not enabled on this node (request "+req.Message()+")", at)},
			"", "remediation.validation is not enabled"},
		{"the agent has not taken it", nil, "", "has not taken the request within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := waitForValidation(t.Context(), agentAnswer{client: fake.NewClientset(tc.objects...), node: "n1", uuid: "GPU-b",
				timeout: 100 * time.Millisecond, poll: 10 * time.Millisecond}, &out, req)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || strings.TrimSpace(out.String()) != tc.want {
				t.Errorf("printed %q, %v; want %q", out.String(), err, tc.want)
			}
		})
	}
}
