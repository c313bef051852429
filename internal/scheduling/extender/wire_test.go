package extender

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
)

// namesArgsSeeds are bodies around the shape parseNamesArgs reads, in and out of it.
var namesArgsSeeds = []string{
	`{"Pod":{"metadata":{"name":"p","uid":"u"}},"Nodes":null,"NodeNames":["a","b"]}`,
	` { "Pod" : { "metadata" : { "name" : "p\"}{" } } , "NodeNames" : [ "a" , "<b&>" ] } trailing`,
	`{"Pod":null,"NodeNames":[]}`,
	`{"NodeNames":null,"Pod":{}}`,
	`{}`,
	`{"pod":{},"NodeNames":["a"]}`,
	`{"Pod":{},"NodeNames":["a\u0062"]}`,
	`{"Pod":{},"NodeNames":["é"]}`,
	`{"Pod":{},"Pod":{},"NodeNames":["a"]}`,
	`{"Pod":{},"NodeNames":["a"],"NodeNames":["b"]}`,
	`{"Pod":{},"Nodes":{"items":[]},"NodeNames":["a"]}`,
	`{"Pod":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"2"}}}]}},"NodeNames":["a"]}`,
	`{"Pod":{"metadata":5},"NodeNames":["a"]}`,
	`{"Pod":{"metadata":{"name":"x"}]},"NodeNames":["a"]}`,
	`{"Pod":{},"NodeNames":["a",]}`,
	`{"Pod":{},"NodeNames":["a"],}`,
	`{"Pod":{},"NodeNames":["a"]`,
	`{"Pod":{},"NodeNames":["a" "b"]}`,
	`{"Pod":{},"Extra":1,"NodeNames":["a"]}`,
	`{"Pod":nul,"NodeNames":["a"]}`,
	`[]`,
	`null`,
	``,
}

// FuzzNamesArgs holds parseNamesArgs to its promise: a body it accepts is valid, and decodes to
// the same pod and node names as with encoding/json's Decoder, which the extender used before.
func FuzzNamesArgs(f *testing.F) {
	for _, s := range namesArgsSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		pod, names, hasNames, ok := parseNamesArgs(body, nil)
		if !ok {
			return
		}
		var want extenderv1.ExtenderArgs
		if err := json.NewDecoder(bytes.NewReader(body)).Decode(&want); err != nil {
			t.Fatalf("parseNamesArgs accepted %q, encoding/json says %v", body, err)
		}
		if want.Nodes != nil {
			t.Fatalf("parseNamesArgs accepted %q, which has Nodes", body)
		}
		if !reflect.DeepEqual(pod, want.Pod) {
			t.Fatalf("%q: pod %#v, encoding/json decodes %#v", body, pod, want.Pod)
		}
		if hasNames != (want.NodeNames != nil) {
			t.Fatalf("%q: hasNames %v, encoding/json decodes NodeNames %v", body, hasNames, want.NodeNames)
		}
		var got []string
		for _, n := range names {
			got = append(got, string(n))
		}
		if want.NodeNames != nil && !slices.Equal(got, *want.NodeNames) {
			t.Fatalf("%q: names %q, encoding/json decodes %q", body, got, *want.NodeNames)
		}
	})
}

func TestParseNamesArgsTakesOnlyTheSchedulersShape(t *testing.T) {
	tests := []struct {
		body string
		ok   bool
	}{
		{namesArgsSeeds[0], true},
		{namesArgsSeeds[1], true},
		{`{"Pod":null,"NodeNames":[]}`, true},
		{`{"pod":{},"NodeNames":["a"]}`, false},             // encoding/json matches keys case-insensitively
		{`{"Pod":{},"NodeNames":["a\u0062"]}`, false},       // an escape
		{`{"Pod":{},"Pod":{},"NodeNames":["a"]}`, false},    // a repeated key
		{`{"Pod":{},"Nodes":{"items":[]}}`, false},          // Node objects
		{`{"Pod":{"metadata":5},"NodeNames":["a"]}`, false}, // a pod encoding/json rejects
	}
	for _, tc := range tests {
		if _, _, _, ok := parseNamesArgs([]byte(tc.body), nil); ok != tc.ok {
			t.Errorf("parseNamesArgs(%s) ok = %v, want %v", tc.body, ok, tc.ok)
		}
	}
}

func TestAppendJSONStringIsEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "gpu-node-00001", "a<b>&c", `q"b\s`, "tab\there", "é", "\x00", "\xff", "\u2028"} {
		want, _ := json.Marshal(s)
		if got := appendJSONString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Errorf("appendJSONString(%q) = %s, want x%s", s, got, want)
		}
		if got := appendJSONString(nil, []byte(s)); string(got) != string(want) {
			t.Errorf("appendJSONString([]byte(%q)) = %s, want %s", s, got, want)
		}
	}
}

// TestFilterRepliesMatchFilter sends /filter and /prioritize bodies that take the hand-written
// path and bodies that take encoding/json's, twice each (the second call reuses the first one's
// buffers), and checks each reply against Filter's or Prioritize's own result for the same
// arguments.
func TestFilterRepliesMatchFilter(t *testing.T) {
	s, _ := started(t, Options{}, cluster(t)...)
	h := s.Handler()
	p := pod("new", "", scheduling.ResourceGPU, 3, nil)
	podJSON, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"sick", "busy", "done", "healthy", "cpu", "missing", "healthy"}
	tests := []struct {
		name string
		body string
	}{
		{"scheduler's shape", mustJSON(t, extenderv1.ExtenderArgs{Pod: p, NodeNames: &names})},
		{"no nodes", `{"Pod":` + string(podJSON) + `,"NodeNames":[]}`},
		{"escaped name", `{"Pod":` + string(podJSON) + `,"NodeNames":["sick","he\u0061lthy"]}`},
		{"lower-case keys", `{"pod":` + string(podJSON) + `,"nodenames":["sick","healthy"]}`},
		{"no pod", `{"NodeNames":["sick"]}`},
		{"no names", `{"Pod":` + string(podJSON) + `}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var args extenderv1.ExtenderArgs
			if err := json.Unmarshal([]byte(tc.body), &args); err != nil {
				t.Fatal(err)
			}
			var want extenderv1.ExtenderFilterResult
			if err := json.Unmarshal([]byte(mustJSON(t, s.Filter(t.Context(), &args))), &want); err != nil {
				t.Fatal(err)
			}
			wantScores, prioErr := s.Prioritize(t.Context(), &args)
			for range 2 {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/filter", bytes.NewReader([]byte(tc.body))))
				checkReply(t, "/filter", rec)
				var got extenderv1.ExtenderFilterResult
				decodeInto(t, rec, &got)
				if rec.Code != http.StatusOK || !reflect.DeepEqual(got, want) {
					t.Fatalf("reply %d %+v\nFilter says %+v", rec.Code, got, want)
				}

				rec = httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/prioritize", bytes.NewReader([]byte(tc.body))))
				checkReply(t, "/prioritize", rec)
				if prioErr != nil {
					var e errorReply
					decodeInto(t, rec, &e)
					if rec.Code != http.StatusBadRequest || e.Error != prioErr.Error() {
						t.Fatalf("/prioritize reply %d %q, Prioritize says %v", rec.Code, e.Error, prioErr)
					}
					continue
				}
				var scores extenderv1.HostPriorityList
				decodeInto(t, rec, &scores)
				if rec.Code != http.StatusOK || !slices.Equal(scores, wantScores) {
					t.Fatalf("/prioritize reply %d %+v\nPrioritize says %+v", rec.Code, scores, wantScores)
				}
			}
		})
	}
}

// TestFilterRemembersLikeFilter checks that a /filter call on the hand-written path remembers
// the same nodes for requeueing as Filter does.
func TestFilterRemembersLikeFilter(t *testing.T) {
	s, _ := started(t, Options{Requeue: true}, cluster(t)...)
	names := []string{"sick", "busy", "done", "healthy", "cpu", "missing"}
	viaHandler, viaFilter := pod("a", "", scheduling.ResourceGPU, 3, nil), pod("b", "", scheduling.ResourceGPU, 3, nil)
	rec := post(t, s.Handler(), "/filter", extenderv1.ExtenderArgs{Pod: viaHandler, NodeNames: &names})
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	filterOn(t, s, viaFilter, names...)
	remembered := func(uid types.UID) []string {
		s.requeue.mu.Lock()
		defer s.requeue.mu.Unlock()
		if p := s.requeue.pods[uid]; p != nil {
			return p.nodes
		}
		return nil
	}
	got, want := remembered(viaHandler.UID), remembered(viaFilter.UID)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("remembered %q through the handler, %q through Filter; want the same, not empty", got, want)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReadBody(t *testing.T) {
	body := strings.Repeat("x", 5000)
	tests := []struct {
		name    string
		r       io.Reader
		hint    int64
		limit   int64
		want    string
		wantErr string
	}{
		{"in one byte reads", iotest.OneByteReader(strings.NewReader(body)), -1, 1 << 20, body, ""},
		{"a hint that is right", strings.NewReader(body), int64(len(body)), 1 << 20, body, ""},
		{"a hint that is too large", strings.NewReader("ab"), 1 << 20, 1 << 20, "ab", ""},
		{"a hint that is too small", strings.NewReader(body), 10, 1 << 20, body, ""},
		{"too large", strings.NewReader(body), -1, 100, "", "request body is larger than 100 bytes"},
		{"a failing reader", iotest.ErrReader(errors.New("reset")), -1, 1 << 20, "", "read request: reset"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(tc.r), tc.limit)
			got, err := readBody(make([]byte, 3, 8), r, tc.hint)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("readBody = %d bytes, %v; want %d bytes", len(got), err, len(tc.want))
			}
		})
	}
}
