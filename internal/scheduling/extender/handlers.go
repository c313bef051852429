package extender

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// Handler serves /filter, /prioritize, /bind and /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", s.serveFilter)
	mux.HandleFunc("POST /prioritize", s.servePrioritize)
	mux.HandleFunc("POST /bind", s.serveBind)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "informer caches not synced yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
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

func (s *Server) serveFilter(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderArgs
	if err := s.decode(w, r, &args); err != nil {
		s.reply(w, http.StatusBadRequest, extenderv1.ExtenderFilterResult{Error: err.Error()})
		return
	}
	result := s.Filter(r.Context(), &args)
	s.reply(w, http.StatusOK, result)
}

func (s *Server) servePrioritize(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderArgs
	if err := s.decode(w, r, &args); err != nil {
		s.reply(w, http.StatusBadRequest, errorReply{Error: err.Error()})
		return
	}
	list, err := s.Prioritize(r.Context(), &args)
	if err != nil {
		s.reply(w, http.StatusBadRequest, errorReply{Error: err.Error()})
		return
	}
	s.reply(w, http.StatusOK, list)
}

func (s *Server) serveBind(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderBindingArgs
	if err := s.decode(w, r, &args); err != nil {
		s.reply(w, http.StatusBadRequest, extenderv1.ExtenderBindingResult{Error: err.Error()})
		return
	}
	var result extenderv1.ExtenderBindingResult
	if err := s.Bind(r.Context(), &args); err != nil {
		result.Error = err.Error()
	}
	s.reply(w, http.StatusOK, result)
}
