package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func qty(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }

func node(name string, gpus int64, ann map[string]string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann, ResourceVersion: "1"},
		Status:     corev1.NodeStatus{Capacity: corev1.ResourceList{scheduling.ResourceGPU: qty(gpus)}},
	}
}

func sharingNode(name string, cards, perCard int64, ann map[string]string) *corev1.Node {
	n := node(name, 0, ann)
	n.Status.Capacity = corev1.ResourceList{scheduling.ResourceGPUNumber: qty(cards), scheduling.ResourceGPUMemory: qty(cards * perCard)}
	return n
}

func pod(name, nodeName string, res corev1.ResourceName, n int64, ann map[string]string) *corev1.Pod {
	phase := corev1.PodRunning
	if nodeName == "" {
		phase = corev1.PodPending
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Annotations: ann},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{
			Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: qty(n)}},
		}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

// started returns a Server fed by a fake clientset holding objs, with its caches filled.
func started(t *testing.T, opts Options, objs ...runtime.Object) (*Server, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(objs...)
	s := New(client, opts)
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s, client
}

func post(t *testing.T, h http.Handler, path string, body any) *httptest.ResponseRecorder {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, bytes.NewReader(b)))
	return rec
}

func decodeInto(t *testing.T, rec *httptest.ResponseRecorder, v any) {
	t.Helper()
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("reply %d is not JSON: %v\n%s", rec.Code, err, rec.Body)
	}
}

func drains(t *testing.T, idx ...int) string {
	t.Helper()
	m := map[string]gpuhealthv1.Drain{}
	for _, i := range idx {
		m["GPU-drained-"+string(rune('a'+i))] = gpuhealthv1.Drain{Index: i, Reason: "maintenance", By: "admin"}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// cluster is the fixture of the filter tests: the pod asks for 3 GPUs.
//
//	sick:    8 GPUs, 6 unhealthy                          -> 2 free
//	busy:    8 GPUs, 4 drained, a running pod holds 2     -> 2 free
//	done:    8 GPUs, 4 drained, a finished pod held 4     -> 4 free
//	healthy: 8 GPUs                                       -> 8 free
//	cpu:     no GPUs
func cluster(t *testing.T) []runtime.Object {
	return []runtime.Object{
		node("sick", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5"}),
		node("busy", 8, map[string]string{gpuhealthv1.DrainsKey: drains(t, 0, 1, 2, 3)}),
		node("done", 8, map[string]string{gpuhealthv1.DrainsKey: drains(t, 0, 1, 2, 3)}),
		node("healthy", 8, nil),
		node("cpu", 0, nil),
		pod("running", "busy", scheduling.ResourceGPU, 2, nil),
		func() *corev1.Pod {
			p := pod("finished", "done", scheduling.ResourceGPU, 4, nil)
			p.Status.Phase = corev1.PodSucceeded
			return p
		}(),
		pod("pending", "", scheduling.ResourceGPU, 8, nil),
	}
}

var wantFailed = map[string]string{
	"sick":    "not enough healthy GPUs: 3 requested, 2 free (6 unhealthy or drained, 0 in use)",
	"busy":    "not enough healthy GPUs: 3 requested, 2 free (4 unhealthy or drained, 2 in use)",
	"cpu":     "node has no nvidia.com/gpu",
	"missing": "node is not in the gpuhealth extender's cache yet",
}

func TestFilterFromCache(t *testing.T) {
	s, _ := started(t, Options{}, cluster(t)...)
	names := []string{"sick", "busy", "done", "healthy", "cpu", "missing"}
	rec := post(t, s.Handler(), "/filter", extenderv1.ExtenderArgs{
		Pod: pod("new", "", scheduling.ResourceGPU, 3, nil), NodeNames: &names,
	})
	var res extenderv1.ExtenderFilterResult
	decodeInto(t, rec, &res)
	if rec.Code != http.StatusOK || res.Error != "" {
		t.Fatalf("status %d, error %q", rec.Code, res.Error)
	}
	if res.NodeNames == nil || strings.Join(*res.NodeNames, ",") != "done,healthy" {
		t.Errorf("NodeNames = %v, want [done healthy]", res.NodeNames)
	}
	if res.Nodes != nil {
		t.Errorf("Nodes = %v, want none on the NodeNames path", res.Nodes)
	}
	for name, want := range wantFailed {
		if got := res.FailedNodes[name]; got != want {
			t.Errorf("FailedNodes[%s] = %q, want %q", name, got, want)
		}
	}
	if len(res.FailedNodes) != len(wantFailed) {
		t.Errorf("FailedNodes = %v", res.FailedNodes)
	}
}

func TestFilterFromRequestNodes(t *testing.T) {
	// The cache knows the pods but none of these nodes' annotations: health comes from the request.
	objs := cluster(t)
	var nodes corev1.NodeList
	var rest []runtime.Object
	for _, o := range objs {
		if n, ok := o.(*corev1.Node); ok {
			n.ResourceVersion = "7"
			nodes.Items = append(nodes.Items, *n)
			continue
		}
		rest = append(rest, o)
	}
	s, _ := started(t, Options{}, rest...)
	rec := post(t, s.Handler(), "/filter", extenderv1.ExtenderArgs{Pod: pod("new", "", scheduling.ResourceGPU, 3, nil), Nodes: &nodes})
	var res extenderv1.ExtenderFilterResult
	decodeInto(t, rec, &res)
	if res.Error != "" || res.Nodes == nil || res.NodeNames != nil {
		t.Fatalf("result %+v", res)
	}
	var kept []string
	for _, n := range res.Nodes.Items {
		kept = append(kept, n.Name)
	}
	if strings.Join(kept, ",") != "done,healthy" {
		t.Errorf("Nodes = %v, want [done healthy]", kept)
	}
	if res.Nodes.Items[0].Annotations[gpuhealthv1.DrainsKey] == "" {
		t.Errorf("kept nodes must be returned whole")
	}
	if got := res.FailedNodes["busy"]; got != wantFailed["busy"] {
		t.Errorf("FailedNodes[busy] = %q, want %q", got, wantFailed["busy"])
	}
}

func TestFilterUsesCachedParseOnlyForTheSameVersion(t *testing.T) {
	s, _ := started(t, Options{}, node("n", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5,6,7"}))
	// The request's copy is newer (recovered): it wins over the cache.
	fresh := node("n", 8, nil)
	fresh.ResourceVersion = "2"
	res := s.Filter(t.Context(), &extenderv1.ExtenderArgs{Pod: pod("p", "", scheduling.ResourceGPU, 1, nil), Nodes: &corev1.NodeList{Items: []corev1.Node{*fresh}}})
	if len(res.Nodes.Items) != 1 {
		t.Errorf("newer node in the request: failed %v, want it kept", res.FailedNodes)
	}
	// Same version: the cached parse is used.
	same := node("n", 8, nil)
	res = s.Filter(t.Context(), &extenderv1.ExtenderArgs{Pod: pod("p", "", scheduling.ResourceGPU, 1, nil), Nodes: &corev1.NodeList{Items: []corev1.Node{*same}}})
	if len(res.Nodes.Items) != 0 {
		t.Errorf("same version: kept %v, want the cached (all unhealthy) view", res.Nodes.Items)
	}
}

func TestFilterSeesInformerUpdates(t *testing.T) {
	s, client := started(t, Options{}, node("n", 2, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1"}))
	names := []string{"n"}
	args := &extenderv1.ExtenderArgs{Pod: pod("p", "", scheduling.ResourceGPU, 1, nil), NodeNames: &names}
	if res := s.Filter(t.Context(), args); len(*res.NodeNames) != 0 {
		t.Fatalf("all GPUs unhealthy, but kept %v", *res.NodeNames)
	}
	// Recovery: the agent removes the annotation.
	if _, err := client.CoreV1().Nodes().Update(t.Context(), node("n", 2, nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(*s.Filter(t.Context(), args).NodeNames) == 1 })
	// A pod lands on the node and takes both GPUs.
	if _, err := client.CoreV1().Pods("default").Create(t.Context(), pod("big", "n", scheduling.ResourceGPU, 2, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(*s.Filter(t.Context(), args).NodeNames) == 0 })
	// It goes away again.
	if err := client.CoreV1().Pods("default").Delete(t.Context(), "big", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(*s.Filter(t.Context(), args).NodeNames) == 1 })
	if err := client.CoreV1().Nodes().Delete(t.Context(), "n", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(*s.Filter(t.Context(), args).NodeNames) == 0 })
}

// waitFor polls cond until it holds: informer events are asynchronous even with a fake
// clientset. Nothing in these tests waits for time to pass; the requeue tests move a fake clock.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("condition not met within 10s: %v", err)
	}
}

func TestPrioritize(t *testing.T) {
	healthJSON := `{"GPU-0":{"index":0,"health":"Degraded"}}`
	s, _ := started(t, Options{},
		node("empty", 8, nil),
		node("packed", 8, nil),
		node("degraded", 8, map[string]string{gpuhealthv1.HealthKey: healthJSON}),
		node("sick", 8, map[string]string{gpuhealthv1.UnhealthyIDsKey: "0,1,2,3,4,5,6,7"}),
		pod("running", "packed", scheduling.ResourceGPU, 6, nil),
	)
	names := []string{"empty", "packed", "degraded", "sick", "missing"}
	rec := post(t, s.Handler(), "/prioritize", extenderv1.ExtenderArgs{Pod: pod("p", "", scheduling.ResourceGPU, 2, nil), NodeNames: &names})
	var list extenderv1.HostPriorityList
	decodeInto(t, rec, &list)
	want := map[string]int64{"empty": 4, "packed": 10, "degraded": 2, "sick": 0, "missing": 0}
	if len(list) != len(want) {
		t.Fatalf("list = %+v", list)
	}
	for _, hp := range list {
		if hp.Score != want[hp.Host] {
			t.Errorf("score of %s = %d, want %d", hp.Host, hp.Score, want[hp.Host])
		}
		if hp.Score < extenderv1.MinExtenderPriority || hp.Score > extenderv1.MaxExtenderPriority {
			t.Errorf("score of %s = %d out of range", hp.Host, hp.Score)
		}
	}
	// Nodes in the request work the same.
	nodes := corev1.NodeList{Items: []corev1.Node{*node("packed", 8, nil)}}
	rec = post(t, s.Handler(), "/prioritize", extenderv1.ExtenderArgs{Pod: pod("p", "", scheduling.ResourceGPU, 2, nil), Nodes: &nodes})
	decodeInto(t, rec, &list)
	if len(list) != 1 || list[0].Score != 10 {
		t.Errorf("list = %+v, want packed=10", list)
	}
}

func TestBadRequests(t *testing.T) {
	s := New(fake.NewClientset(), Options{MaxRequestBytes: 1024})
	h := s.Handler()
	tests := []struct {
		name, method, path, body string
		wantStatus               int
		wantError                string
	}{
		{"filter not JSON", http.MethodPost, "/filter", "{", http.StatusBadRequest, "decode request"},
		{"filter too large", http.MethodPost, "/filter", `{"Pod":{"metadata":{"name":"` + strings.Repeat("x", 2048) + `"}}}`, http.StatusBadRequest, "larger than 1024 bytes"},
		{"filter without pod", http.MethodPost, "/filter", `{"NodeNames":["a"]}`, http.StatusOK, "request has no pod"},
		{"filter without nodes", http.MethodPost, "/filter", `{"Pod":{}}`, http.StatusOK, "neither Nodes nor NodeNames"},
		{"prioritize not JSON", http.MethodPost, "/prioritize", "[", http.StatusBadRequest, "decode request"},
		{"prioritize without pod", http.MethodPost, "/prioritize", `{}`, http.StatusBadRequest, "request has no pod"},
		{"bind not JSON", http.MethodPost, "/bind", "x", http.StatusBadRequest, "decode request"},
		{"bind when off", http.MethodPost, "/bind", `{"PodName":"p","PodNamespace":"default","Node":"n"}`, http.StatusOK, "binding is off"},
		{"GET filter", http.MethodGet, "/filter", "", http.StatusMethodNotAllowed, ""},
		{"healthz before sync", http.MethodGet, "/healthz", "", http.StatusServiceUnavailable, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), tc.method, tc.path, strings.NewReader(tc.body)))
			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", rec.Code, tc.wantStatus, rec.Body)
			}
			if tc.wantError == "" {
				return
			}
			var body struct{ Error string }
			decodeInto(t, rec, &body)
			if !strings.Contains(body.Error, tc.wantError) {
				t.Errorf("Error = %q, want it to contain %q", body.Error, tc.wantError)
			}
		})
	}
}
