package extender

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// Handler serves /filter, /prioritize, /bind, /healthz and /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", s.timed(verbFilter, s.serveFilter))
	mux.HandleFunc("POST /prioritize", s.timed(verbPrioritize, s.servePrioritize))
	mux.HandleFunc("POST /bind", s.timed(verbBind, s.serveBind))
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

func (s *Server) serveFilter(w http.ResponseWriter, r *http.Request) (failed bool) {
	var args extenderv1.ExtenderArgs
	if err := s.decode(w, r, &args); err != nil {
		s.reply(w, http.StatusBadRequest, extenderv1.ExtenderFilterResult{Error: err.Error()})
		return true
	}
	result := s.Filter(r.Context(), &args)
	s.reply(w, http.StatusOK, result)
	return result.Error != ""
}

func (s *Server) servePrioritize(w http.ResponseWriter, r *http.Request) (failed bool) {
	var args extenderv1.ExtenderArgs
	if err := s.decode(w, r, &args); err != nil {
		s.reply(w, http.StatusBadRequest, errorReply{Error: err.Error()})
		return true
	}
	list, err := s.Prioritize(r.Context(), &args)
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
