package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// FuzzRequests throws arbitrary bodies at /filter and /prioritize. Whatever the body, the
// extender answers 200, or 400 for a body it cannot decode, never a 5xx and never a panic; the
// reply is JSON of the type kube-scheduler expects from that call (an error reply for a 400 of
// /prioritize), and a filter result without an error names the nodes that are left.
func FuzzRequests(f *testing.F) {
	f.Add([]byte(`{"Pod":{"metadata":{"name":"p"}},"NodeNames":["n"]}`))
	f.Add([]byte(`{"Pod":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"2"}}}]}},"Nodes":{"items":[{"metadata":{"name":"n","annotations":{"volcano.sh/gpu-unhealthy-ids":"0,,x,-1,99"}},"status":{"capacity":{"nvidia.com/gpu":"8"}}}]}}`))
	f.Add([]byte(`{"Pod":null}`))
	f.Add([]byte(`{"Pod":{}}`))
	f.Add([]byte(`{"Pod":{},"NodeNames":null,"Nodes":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte("\xff\xfe"))
	f.Add([]byte(`{"Pod":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"99999999999999999999"}}}]}},"NodeNames":["a","b"]}`))
	f.Add([]byte(`{"Pod":{"spec":{"containers":[{"resources":{"limits":{"volcano.sh/gpu-memory":"-5"}}}]}},"NodeNames":[""]}`))
	s := New(fake.NewClientset(), Options{MaxRequestBytes: 1 << 20})
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)
	if err := s.Start(ctx); err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/filter", "/prioritize"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body)))
			checkReply(t, path, rec)
		}
	})
}

// checkReply fails t unless rec is an answer kube-scheduler can use: see FuzzRequests.
func checkReply(t *testing.T, path string, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusOK && rec.Code != http.StatusBadRequest {
		t.Fatalf("%s answered %d, want 200, or 400 for a body that does not decode: %s", path, rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s answered Content-Type %q, want application/json", path, ct)
	}
	strict := func(v any) error {
		d := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
		d.DisallowUnknownFields()
		return d.Decode(v)
	}
	switch {
	case path == "/filter":
		var res extenderv1.ExtenderFilterResult
		if err := strict(&res); err != nil {
			t.Fatalf("/filter answered %d with a body that is not an ExtenderFilterResult: %v\n%s", rec.Code, err, rec.Body)
		}
		if rec.Code == http.StatusOK && res.Error == "" && res.NodeNames == nil && res.Nodes == nil {
			t.Fatalf("/filter answered 200 without an error and without nodes: %s", rec.Body)
		}
		if rec.Code == http.StatusBadRequest && res.Error == "" {
			t.Fatalf("/filter answered 400 without saying why: %s", rec.Body)
		}
	case rec.Code == http.StatusOK:
		var list extenderv1.HostPriorityList
		if err := strict(&list); err != nil {
			t.Fatalf("/prioritize answered 200 with a body that is not a HostPriorityList: %v\n%s", err, rec.Body)
		}
		for _, hp := range list {
			if hp.Score < extenderv1.MinExtenderPriority || hp.Score > extenderv1.MaxExtenderPriority {
				t.Fatalf("/prioritize scored %s %d, out of range", hp.Host, hp.Score)
			}
		}
	default:
		var e errorReply
		if err := strict(&e); err != nil || e.Error == "" {
			t.Fatalf("/prioritize answered 400 with a body that is not an error reply (%v): %s", err, rec.Body)
		}
	}
}
