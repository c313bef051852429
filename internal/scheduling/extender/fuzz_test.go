package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

// FuzzRequests throws arbitrary bodies at /filter and /prioritize: the extender must answer every
// one with a well-formed HTTP response (JSON on success, an error otherwise) and never panic.
func FuzzRequests(f *testing.F) {
	f.Add([]byte(`{"Pod":{"metadata":{"name":"p"}},"NodeNames":["n"]}`))
	f.Add([]byte(`{"Pod":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"2"}}}]}},"Nodes":{"items":[{"metadata":{"name":"n","annotations":{"volcano.sh/gpu-unhealthy-ids":"0,,x,-1,99"}},"status":{"capacity":{"nvidia.com/gpu":"8"}}}]}}`))
	f.Add([]byte(`{"Pod":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte("\xff\xfe"))
	f.Add([]byte(`{"Pod":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"99999999999999999999"}}}]}},"NodeNames":["a","b"]}`))
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
			if rec.Code == http.StatusOK && !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s answered 200 with invalid JSON: %q", path, rec.Body.String())
			}
			if rec.Code == 0 {
				t.Fatalf("%s wrote no status", path)
			}
		}
	})
}
