package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// Bad flags and arguments are refused before anything reaches the API server.
func TestClearCommandRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no reason", []string{"clear", "n1", "1"}, "--reason: required"},
		{"a blank reason", []string{"clear", "n1", "1", "--reason", "  "}, "--reason: required"},
		{"a condition with a space", []string{"clear", "n1", "1", "XID 79", "--reason", "r"}, `condition "XID 79"`},
		{"a TYPE:CODE without a number", []string{"clear", "n1", "1", "XID:x", "--reason", "r"}, "TYPE:CODE"},
		{"a drain", []string{"clear", "n1", "1", "AdminDrain", "--reason", "r"}, "gpuhealth undrain ends it"},
		{"a negative wait", []string{"clear", "n1", "1", "--reason", "r", "--wait", "-1s"}, "--wait"},
		{"no GPU", []string{"clear", "n1", "--reason", "r"}, "accepts between 2 and 3 arg(s)"},
		{"too many arguments", []string{"clear", "n1", "1", "XID79", "more", "--reason", "r"}, "accepts between 2 and 3 arg(s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// An unreadable kubeconfig: any request would fail, and with another message.
			args := append(tc.args, "--kubeconfig", "/nonexistent/kubeconfig")
			if code := Execute(context.Background(), args, &stdout, &stderr); code != ExitBadInput || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr.String(), ExitBadInput, tc.want)
			}
		})
	}
}

func clearNode(clears string) *corev1.Node {
	n := gpuNodeObject("")
	if clears != "" {
		n.Annotations[gpuhealthv1.ClearsKey] = clears
	}
	return n
}

func TestRequestClear(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	existing := `{"GPU-b":[{"index":1,"condition":"XID79","reason":"first","by":"alice","at":"2026-11-30T09:00:00Z"}]}`
	for _, tc := range []struct {
		name, node, gpu, clears string
		// want: the requests on GPU-b afterwards; wantErr: the error, and the annotation unchanged.
		want     int
		wantErr  string
		badInput bool
	}{
		{name: "by index", gpu: "1", want: 1},
		{name: "by PCI bus ID, beside an earlier request", gpu: "0000:11:00.0", clears: existing, want: 2},
		{name: "by UUID in another case", gpu: "gpu-b", want: 1},
		{name: "a node that does not exist", node: "n9", gpu: "1", wantErr: `node "n9" not found`, badInput: true},
		{name: "an index the agent does not report", gpu: "7", wantErr: `no GPU "7"`, badInput: true},
		{name: "a UUID the agent does not report", gpu: "GPU-new", wantErr: "reports no GPU GPU-new", badInput: true},
		{name: "a MIG instance (its GPU is cleared with its instances)", gpu: "MIG-b1", wantErr: "no GPU", badInput: true},
		{name: "a malformed annotation", gpu: "1", clears: `{"GPU-b":`, wantErr: "fix or remove the annotation by hand"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(clearNode(tc.clears))
			node := tc.node
			if node == "" {
				node = "n1"
			}
			req := gpuhealthv1.Clear{Condition: "XID79", Reason: "loose cable", By: "carol", At: at}
			gpu, err := requestClear(ctx, client, node, tc.gpu, &req)
			after, getErr := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
			if getErr != nil {
				t.Fatal(getErr)
			}
			value := after.Annotations[gpuhealthv1.ClearsKey]
			if tc.wantErr != "" {
				var input cmdutil.InputError
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || errors.As(err, &input) != tc.badInput {
					t.Fatalf("err = %v, want %q (bad input: %v)", err, tc.wantErr, tc.badInput)
				}
				if value != tc.clears {
					t.Errorf("the annotation changed to %q on an error", value)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			clears, err := gpuhealthv1.ParseClears(value)
			if err != nil {
				t.Fatal(err)
			}
			got := clears["GPU-b"]
			if gpu.uuid != "GPU-b" || gpu.Index != 1 || len(got) != tc.want || got[len(got)-1] != (gpuhealthv1.Clear{Index: 1, Condition: "XID79", Reason: "loose cable", By: "carol", At: at}) {
				t.Errorf("requests on GPU-b: %+v (resolved %+v), want %d, the last carol's", got, gpu, tc.want)
			}
		})
	}
}

// A conflict (someone wrote the Node meanwhile) reads the Node again and keeps their request.
func TestRequestClearRetriesOnConflict(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(clearNode(""))
	raced := false
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if raced {
			return false, nil, nil
		}
		raced = true
		// Another operator's request lands first.
		n, err := client.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", "n1")
		if err != nil {
			return true, nil, err
		}
		node := n.(*corev1.Node).DeepCopy()
		node.Annotations[gpuhealthv1.ClearsKey] = `{"GPU-b":[{"index":1,"reason":"theirs","by":"dave","at":"2026-11-30T10:00:00Z"}]}`
		if err := client.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, node, ""); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "n1", errors.New("the object has been modified"))
	})
	req := gpuhealthv1.Clear{Reason: "mine", By: "carol", At: time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC)}
	if _, err := requestClear(ctx, client, "n1", "1", &req); err != nil {
		t.Fatal(err)
	}
	n, _ := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	clears, err := gpuhealthv1.ParseClears(n.Annotations[gpuhealthv1.ClearsKey])
	if err != nil || len(clears["GPU-b"]) != 2 || clears["GPU-b"][0].By != "dave" || clears["GPU-b"][1].By != "carol" {
		t.Errorf("after the conflict: %+v, %v; want dave's request and then carol's", clears, err)
	}
}

func TestClearNote(t *testing.T) {
	gpu := func(reasons ...string) clearedGPU {
		return clearedGPU{uuid: "GPU-b", GPUSummary: gpuhealthv1.GPUSummary{Index: 1, Reasons: reasons}}
	}
	for _, tc := range []struct {
		name      string
		gpu       clearedGPU
		condition string
		want      string
	}{
		{"its reason", gpu("XID79"), "XID79", ""},
		{"its reason in another case", gpu("XID79"), "xid79", ""},
		{"every condition", gpu("XID79"), "", ""},
		{"a type", gpu("XID79"), "XID", ""},
		{"TYPE:CODE is left to the agent", gpu("XID79"), "XID:48", ""},
		{"a reason it does not report", gpu("XID79"), "XID48", "reports XID79, not XID48, unless XID48 is a type"},
		{"an instance's reason", clearedGPU{uuid: "GPU-b", instanceReasons: []string{"XID109"}}, "XID109", ""},
		{"nothing", gpu(), "XID79", "reports no condition now"},
		{"only a drain", gpu("AdminDrain"), "", "is drained and reports nothing else (gpuhealth undrain ends a drain)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := clearNote(tc.gpu, tc.condition); got != tc.want {
				t.Errorf("clearNote = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWaitForClear(t *testing.T) {
	ctx := context.Background()
	req := gpuhealthv1.Clear{Index: 1, Condition: "XID79", Reason: "loose cable", By: "carol", At: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	pending := `{"GPU-b":[{"index":1,"condition":"XID79","reason":"loose cable","by":"carol","at":"2026-11-30T10:00:00Z"}]}`
	event := func(reason, msg string) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "e-" + reason, Namespace: metav1.NamespaceDefault},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "n1"},
			Reason:         reason, Message: msg,
		}
	}
	cleared := "gpuhealth cleared XID79 on GPU 1 (GPU-b), requested " + req.Message() + "; now Healthy"
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		want    string // on stdout
		wantErr string
	}{
		{"the agent has not applied it", []runtime.Object{clearNode(pending)}, "", "has not applied the request within"},
		{"cleared", []runtime.Object{clearNode(""), event(gpuhealthv1.EventConditionsCleared, cleared)}, cleared, ""},
		{"another request's Event does not count", []runtime.Object{clearNode(""),
			event(gpuhealthv1.EventConditionsCleared, "gpuhealth cleared XID79 on GPU 1 (GPU-b), requested by dave: other; now Healthy")},
			"the agent of node n1 applied the request (no Event of it found); GPU 1 (GPU-b) reports Unhealthy (XID79)", ""},
		{"nothing matched", []runtime.Object{clearNode(""),
			event(gpuhealthv1.EventClearMatchedNothing, "gpuhealth cleared nothing on GPU 1 (GPU-b): no condition XID79 in effect; requested "+req.Message())},
			"", "cleared nothing on GPU 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := waitForClear(ctx, agentAnswer{client: fake.NewClientset(tc.objects...), node: "n1", uuid: "GPU-b", timeout: 100 * time.Millisecond, poll: 10 * time.Millisecond}, &out, req)
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
