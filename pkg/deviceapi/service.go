package deviceapi

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/v1alpha1"
)

// watcher is one WatchGpus stream's feed. Run offers it events without ever waiting; its
// handler sends them. Run closes gone (once, with err set before) when it drops the watcher.
type watcher struct {
	events chan *v1alpha1.WatchGpusResponse
	gone   chan struct{}
	err    error
}

// offer queues ev; false when the buffer is full.
func (w *watcher) offer(ev *v1alpha1.WatchGpusResponse) bool {
	select {
	case w.events <- ev:
		return true
	default:
		return false
	}
}

// dropLocked ends w's feed with err, the status its stream ends with.
func (s *Server) dropLocked(w *watcher, err error) {
	if _, ok := s.watchers[w]; !ok {
		return
	}
	delete(s.watchers, w)
	w.err = err
	close(w.gone)
}

// admit takes a watcher's place and returns its feed and the Gpus it starts from, taken in the
// same critical section that registers it, so that every later change reaches it exactly once.
func (s *Server) admit() (*watcher, []*v1alpha1.Gpu, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return nil, nil, errStopped
	case s.open >= s.opts.MaxWatchers:
		s.refused++
		if now := s.opts.Clock.Now(); now.Sub(s.refusedLogged) >= refusalLogPeriod {
			s.logger.Info("Refused Device API watches: too many open", "max", s.opts.MaxWatchers, "refused", s.refused)
			s.refused, s.refusedLogged = 0, now
		}
		return nil, nil, status.Errorf(codes.ResourceExhausted, "%d watches are open, the most this server allows; try again later", s.opts.MaxWatchers)
	}
	s.open++
	w := &watcher{events: make(chan *v1alpha1.WatchGpusResponse, s.opts.WatchBuffer), gone: make(chan struct{})}
	s.watchers[w] = struct{}{}
	return w, s.listLocked(), nil
}

// refusalLogPeriod is how often refused watches are logged at most.
const refusalLogPeriod = time.Minute

// release gives w's place back once its handler returns.
func (s *Server) release(w *watcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open--
	delete(s.watchers, w)
}

// GetGpu returns the GPU named req.name: its lowercased UUID (the UUID in any case is taken
// too).
func (s *Server) GetGpu(ctx context.Context, req *v1alpha1.GetGpuRequest) (*v1alpha1.GetGpuResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required: a GPU's lowercased UUID")
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	g, err := s.get(req.GetName())
	if err != nil {
		return nil, err
	}
	return &v1alpha1.GetGpuResponse{Gpu: g}, nil
}

// ListGpus returns every GPU of the node, in index order.
func (s *Server) ListGpus(ctx context.Context, _ *v1alpha1.ListGpusRequest) (*v1alpha1.ListGpusResponse, error) {
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	gpus, err := s.list()
	if err != nil {
		return nil, err
	}
	return &v1alpha1.ListGpusResponse{GpuList: &v1alpha1.GpuList{Items: gpus}}, nil
}

// WatchGpus sends every GPU as ADDED, then each change of a GPU once, as MODIFIED (or ADDED and
// DELETED for a GPU that comes or goes), until the client leaves (CANCELED), falls further
// behind than its buffer (RESOURCE_EXHAUSTED) or the server stops (UNAVAILABLE).
func (s *Server) WatchGpus(_ *v1alpha1.WatchGpusRequest, stream grpc.ServerStreamingServer[v1alpha1.WatchGpusResponse]) error {
	ctx := stream.Context()
	if err := s.waitReady(ctx); err != nil {
		return err
	}
	w, initial, err := s.admit()
	if err != nil {
		return err
	}
	defer s.release(w)
	for _, g := range initial {
		if err := stream.Send(&v1alpha1.WatchGpusResponse{Type: EventAdded, Object: g}); err != nil {
			return err
		}
	}
	for {
		// A dropped watcher ends at once: what is still queued is no longer the whole story.
		select {
		case <-w.gone:
			return w.err
		default:
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-w.gone:
			return w.err
		case ev := <-w.events:
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}
