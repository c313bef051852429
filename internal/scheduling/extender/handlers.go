package extender

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
)

// Handler serves /filter, /prioritize, /bind, /healthz and /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", s.scheduler(s.timed(verbFilter, s.serveFilter)))
	mux.HandleFunc("POST /prioritize", s.scheduler(s.timed(verbPrioritize, s.servePrioritize)))
	mux.HandleFunc("POST /bind", s.scheduler(s.timed(verbBind, s.serveBind)))
	mux.Handle("GET /metrics", s.metrics.handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "informer caches not synced yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}

// scheduler admits a scheduler call: with client authentication on (Options.TLS.ClientCAs) only
// from a client whose certificate verified, and only while fewer than Options.MaxConcurrent calls
// are being served (503 otherwise, at once, without reading the body).
func (s *Server) scheduler(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.opts.TLS != nil && s.opts.TLS.ClientCAs != nil && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
			s.metrics.refused.WithLabelValues("unauthenticated").Inc()
			http.Error(w, "a client certificate signed by the extender's client CA (--client-ca-file) is required", http.StatusUnauthorized)
			return
		}
		// kube-scheduler sends its whole body at once and gives up after its httpTimeout (5 s by
		// default): a body still arriving after BodyTimeout is a slow client holding a call slot.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(cmp.Or(s.opts.BodyTimeout, DefaultBodyTimeout)))
		select {
		case s.inFlight <- struct{}{}:
			defer func() { <-s.inFlight }()
		default:
			s.metrics.refused.WithLabelValues("busy").Inc()
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many calls in flight", http.StatusServiceUnavailable)
			return
		}
		next(w, r)
	}
}

// timed serves a verb with serve, which says whether it answered an error, and records how long
// the answer took and whether it was an error.
func (s *Server) timed(verb string, serve func(http.ResponseWriter, *http.Request) (failed bool)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := s.opts.Clock.Now()
		if serve(w, r) {
			s.metrics.errors.WithLabelValues(verb).Inc()
		}
		s.metrics.duration.WithLabelValues(verb).Observe(s.opts.Clock.Since(start).Seconds())
	}
}

// decode reads a JSON request body of at most MaxRequestBytes into v.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, s.opts.MaxRequestBytes)
	if err := json.NewDecoder(body).Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fmt.Errorf("request body is larger than %d bytes", tooBig.Limit)
		}
		return fmt.Errorf("decode request: %w", err)
	}
	return nil
}

func (s *Server) reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		s.logger.V(2).Info("Writing a reply failed", "err", err)
	}
}

// errorReply is the body of a request that could not be decoded; kube-scheduler only sees the
// status code, a person with curl sees why.
type errorReply struct {
	Error string
}

// filterBuffers are the buffers of one /filter call, kept in Server.buffers for the next.
type filterBuffers struct {
	body, fit, failed []byte
	names             [][]byte
	judge             scheduling.Judge
	// quotedReasons holds the reasons as JSON strings: thousands of nodes share a few. Like
	// the reasons judge keeps, it is kept between calls, up to maxQuotedReasons.
	quotedReasons map[string][]byte
}

const maxQuotedReasons = 1024

// quoted returns reason as a JSON string.
func (b *filterBuffers) quoted(reason string) []byte {
	if q, ok := b.quotedReasons[reason]; ok {
		return q
	}
	if b.quotedReasons == nil || len(b.quotedReasons) >= maxQuotedReasons {
		b.quotedReasons = map[string][]byte{}
	}
	q := appendJSONString(nil, reason)
	b.quotedReasons[reason] = q
	return q
}

// initialBodyBytes is the most a body's Content-Length allocates before it arrives: 256 KiB holds
// a nodeCacheCapable request for 10,000 nodes.
const initialBodyBytes = 256 << 10

// DefaultBodyTimeout bounds how long a scheduler call's body may take to arrive: kube-scheduler's
// own httpTimeout for an extender call.
const DefaultBodyTimeout = 5 * time.Second

// maxPooledBytes bounds the buffers kept between calls: a request with Node objects in it may be
// a hundred MiB, and that is not worth keeping.
const maxPooledBytes = 8 << 20

// getBuffers takes a filterBuffers from the pool; putBuffers gives it back.
func (s *Server) getBuffers() *filterBuffers {
	if b, _ := s.buffers.Get().(*filterBuffers); b != nil {
		return b
	}
	return &filterBuffers{}
}

func (s *Server) putBuffers(b *filterBuffers) {
	clear(b.names)
	if cap(b.body) <= maxPooledBytes && cap(b.fit) <= maxPooledBytes && cap(b.failed) <= maxPooledBytes {
		s.buffers.Put(b)
	}
}

// readArgs reads the body of a /filter or /prioritize call into b.body and, when it has the
// shape parseNamesArgs reads, the pod and the node names (ok). Otherwise the caller decodes
// b.body with encoding/json.
func (s *Server) readArgs(w http.ResponseWriter, r *http.Request, b *filterBuffers) (pod *corev1.Pod, hasNames, ok bool, err error) {
	// The Content-Length only sizes the first allocation, up to initialBodyBytes: the buffer
	// grows with what arrives, so a client that announces 8 MiB and trickles costs what it sent,
	// not 8 MiB from its first byte (64 such clients were the chart's whole memory limit).
	b.body, err = readBody(b.body, http.MaxBytesReader(w, r.Body, s.opts.MaxRequestBytes), min(r.ContentLength, initialBodyBytes))
	if err != nil {
		return nil, false, false, err
	}
	pod, b.names, hasNames, ok = parseNamesArgs(b.body, b.names[:0])
	return pod, hasNames, ok, nil
}

// decodeArgs decodes a body readArgs could not, as encoding/json does.
func decodeArgs(body []byte) (*extenderv1.ExtenderArgs, error) {
	var args extenderv1.ExtenderArgs
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&args); err != nil {
		return nil, fmt.Errorf("decode request: %w", err)
	}
	return &args, nil
}

// replyJSON writes a reply already encoded.
func (s *Server) replyJSON(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(body); err != nil {
		s.logger.V(2).Info("Writing a reply failed", "err", err)
	}
}

func (s *Server) serveFilter(w http.ResponseWriter, r *http.Request) (failed bool) {
	b := s.getBuffers()
	defer s.putBuffers(b)
	pod, hasNames, ok, err := s.readArgs(w, r, b)
	if err != nil {
		s.reply(w, http.StatusBadRequest, extenderv1.ExtenderFilterResult{Error: err.Error()})
		return true
	}
	switch {
	case ok && pod != nil && hasNames:
		s.replyJSON(w, s.filterNamed(r.Context(), pod, b.names, b))
		return false
	case ok:
		// No pod or no names: Filter says what is missing.
		result := s.Filter(r.Context(), &extenderv1.ExtenderArgs{Pod: pod})
		s.reply(w, http.StatusOK, result)
		return result.Error != ""
	}
	args, err := decodeArgs(b.body)
	if err != nil {
		s.reply(w, http.StatusBadRequest, extenderv1.ExtenderFilterResult{Error: err.Error()})
		return true
	}
	result := s.Filter(r.Context(), args)
	s.reply(w, http.StatusOK, result)
	return result.Error != ""
}

func (s *Server) servePrioritize(w http.ResponseWriter, r *http.Request) (failed bool) {
	b := s.getBuffers()
	defer s.putBuffers(b)
	pod, hasNames, ok, err := s.readArgs(w, r, b)
	if err != nil {
		s.reply(w, http.StatusBadRequest, errorReply{Error: err.Error()})
		return true
	}
	if ok && pod != nil && hasNames {
		s.replyJSON(w, s.prioritizeNamed(r.Context(), pod, b.names, b))
		return false
	}
	args := &extenderv1.ExtenderArgs{Pod: pod}
	if !ok {
		if args, err = decodeArgs(b.body); err != nil {
			s.reply(w, http.StatusBadRequest, errorReply{Error: err.Error()})
			return true
		}
	}
	list, err := s.Prioritize(r.Context(), args)
	if err != nil {
		s.reply(w, http.StatusBadRequest, errorReply{Error: err.Error()})
		return true
	}
	s.reply(w, http.StatusOK, list)
	return false
}

func (s *Server) serveBind(w http.ResponseWriter, r *http.Request) (failed bool) {
	var args extenderv1.ExtenderBindingArgs
	if err := s.decode(w, r, &args); err != nil {
		s.reply(w, http.StatusBadRequest, extenderv1.ExtenderBindingResult{Error: err.Error()})
		return true
	}
	var result extenderv1.ExtenderBindingResult
	if err := s.Bind(r.Context(), &args); err != nil {
		result.Error = err.Error()
	}
	s.reply(w, http.StatusOK, result)
	return result.Error != ""
}
