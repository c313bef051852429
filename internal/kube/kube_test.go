package kube

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// apiRecorder is an API server stand-in on loopback that answers every request with an empty
// object of the kind asked for, and records what it was asked.
type apiRecorder struct {
	mu       sync.Mutex
	requests []string // "METHOD PATH ACCEPT"
}

func (a *apiRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.requests = append(a.requests, r.Method+" "+r.URL.Path+" "+r.Header.Get("Accept"))
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	kind := "Node"
	switch {
	case strings.HasSuffix(r.URL.Path, "/leases") || strings.Contains(r.URL.Path, "/leases/"):
		kind = "Lease"
	case strings.Contains(r.URL.Path, "/events"):
		kind = "Event"
	case strings.HasSuffix(r.URL.Path, "/devicetaintrules"):
		kind = "DeviceTaintRuleList"
	}
	apiVersion := "v1"
	if strings.HasPrefix(r.URL.Path, "/apis/") {
		apiVersion = strings.Join(strings.Split(r.URL.Path, "/")[2:4], "/")
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"kind": kind, "apiVersion": apiVersion, "metadata": map[string]any{"name": "x"}})
}

func TestClientsetTalksToEachGroupsPathsPreferringProtobuf(t *testing.T) {
	rec := &apiRecorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	cs, err := NewForConfig(&rest.Config{Host: srv.URL, QPS: 50, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoordinationV1().Leases("ns1").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The event sink posts each Event to its own namespace, as client-go's EventSinkImpl does.
	if _, err := (EventSink{Client: cs}).Create(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "ev-ns"}}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"GET /api/v1/nodes/n1",
		"GET /apis/resource.k8s.io/v1/devicetaintrules",
		"POST /apis/coordination.k8s.io/v1/namespaces/ns1/leases",
		"POST /api/v1/namespaces/ev-ns/events",
	}
	if len(rec.requests) != len(want) {
		t.Fatalf("requests %q, want %d", rec.requests, len(want))
	}
	for i, w := range want {
		got := rec.requests[i]
		if !strings.HasPrefix(got, w+" ") {
			t.Errorf("request %d is %q, want %q", i, got, w)
		}
		// client-go's generated clients ask for protobuf first; so must these.
		if !strings.Contains(got, "application/vnd.kubernetes.protobuf") {
			t.Errorf("request %q does not accept protobuf", got)
		}
	}
}

func TestClientsetSharesOneRateLimiterAcrossGroups(t *testing.T) {
	cs, err := NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", QPS: 5, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	// The agent's QPS and burst are its own, not each group's (kubernetes.NewForConfig does the same).
	if l := cs.core.GetRateLimiter(); l == nil || l != cs.resource.GetRateLimiter() || l != cs.coordination.GetRateLimiter() {
		t.Error("the groups' REST clients do not share one rate limiter")
	}
	if _, err := NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", QPS: 5}); err == nil {
		t.Error("QPS without burst was accepted")
	}
}
