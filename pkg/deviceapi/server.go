package deviceapi

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/v1alpha1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Watch event types (WatchGpusResponse.type).
const (
	EventAdded    = "ADDED"
	EventModified = "MODIFIED"
	EventDeleted  = "DELETED"
)

// Defaults of Options.
const (
	DefaultMaxWatchers = 64
	DefaultWatchBuffer = 1024
)

// Source is what a Server serves: a *health.Monitor, or anything else that hands out
// subscriptions to one.
type Source interface {
	Subscribe() *health.Subscription
}

var _ Source = (*health.Monitor)(nil)

// Options configure a Server.
type Options struct {
	// MaxWatchers bounds the WatchGpus streams open at once (default 64); one more is refused
	// with RESOURCE_EXHAUSTED. A stream holds its place until its handler returns.
	MaxWatchers int
	// WatchBuffer is how many events one watcher may have waiting to be sent (default 1024). A
	// watcher whose buffer is full is dropped: its stream ends with RESOURCE_EXHAUSTED, and the
	// client lists or watches again. Nothing else ever waits for a watcher.
	WatchBuffer int
	// Clock dates the changes to True or Unknown (a change to False takes the time its fault
	// began); default the real clock.
	Clock clock.PassiveClock
}

// Server serves the Device API's GpuService from a Source. Run follows the source; Register
// adds the service to a gRPC server, or Serve and ServeSocket run one.
//
// One goroutine (Run) turns each snapshot into Gpus and hands the changed ones to every
// watcher's bounded buffer without waiting; each WatchGpus handler sends from its own buffer.
// A slow or stuck client therefore costs only its own stream: it never delays the Monitor,
// Run, or the other watchers.
type Server struct {
	v1alpha1.UnsafeGpuServiceServer

	src  Source
	opts Options
	// ready is closed once Run has converted the first snapshot; logger is set before.
	ready  chan struct{}
	logger logr.Logger

	mu sync.Mutex
	// gpus are the current Gpus by name, order their names in the snapshot's order; both are
	// replaced, never changed in place, and every Gpu is immutable once published.
	gpus  map[string]*v1alpha1.Gpu
	order []string
	// watchers are the streams being fed; open counts the WatchGpus handlers holding a place.
	watchers map[*watcher]struct{}
	open     int
	// stopped is set once Run returned: calls are refused, and every watcher was ended.
	stopped bool
	// refused counts the watches refused since refusedLogged, when the last refusal was
	// logged: a client that keeps trying is logged once a minute, not once a try.
	refused       int
	refusedLogged time.Time
}

var _ v1alpha1.GpuServiceServer = (*Server)(nil)

// New returns a Server of src. It serves nothing before Run converts the first snapshot: calls
// made earlier wait for that.
func New(src Source, opts Options) *Server {
	if opts.MaxWatchers <= 0 {
		opts.MaxWatchers = DefaultMaxWatchers
	}
	if opts.WatchBuffer <= 0 {
		opts.WatchBuffer = DefaultWatchBuffer
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Server{src: src, opts: opts, ready: make(chan struct{}), gpus: map[string]*v1alpha1.Gpu{}, watchers: map[*watcher]struct{}{}}
}

// Register adds the GpuService to r (a *grpc.Server of the embedder's, for one): the embedder
// then runs Run beside it.
func (s *Server) Register(r grpc.ServiceRegistrar) { v1alpha1.RegisterGpuServiceServer(r, s) }

// Run follows the source until ctx ends, then ends every watch and refuses every call
// (UNAVAILABLE): what it would serve no longer follows the GPUs. It returns nil. Call it once.
func (s *Server) Run(ctx context.Context) error {
	s.logger = klog.FromContext(ctx)
	sub := s.src.Subscribe()
	defer sub.Close()
	defer s.stop()
	// A new subscription has the current snapshot pending: the first Next never waits.
	if u, ok := sub.Next(); ok {
		s.apply(u.Snapshot)
	}
	close(s.ready)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.C():
		}
		if u, ok := sub.Next(); ok {
			s.apply(u.Snapshot)
		}
	}
}

// apply publishes the Gpus of snap and hands every change to every watcher, once.
func (s *Server) apply(snap health.Snapshot) {
	// Only Run writes gpus: reading it here without the lock is safe.
	next := Convert(snap, s.gpus, s.opts.Clock.Now())
	gpus := make(map[string]*v1alpha1.Gpu, len(next))
	order := make([]string, 0, len(next))
	var events []*v1alpha1.WatchGpusResponse
	for _, g := range next {
		gpus[g.Name] = g
		order = append(order, g.Name)
		switch old, ok := s.gpus[g.Name]; {
		case !ok:
			events = append(events, &v1alpha1.WatchGpusResponse{Type: EventAdded, Object: g})
		case !proto.Equal(old, g):
			events = append(events, &v1alpha1.WatchGpusResponse{Type: EventModified, Object: g})
		default:
			gpus[g.Name] = old // unchanged: keep the object watchers already have
		}
	}
	for _, name := range s.order {
		if _, ok := gpus[name]; !ok {
			events = append(events, &v1alpha1.WatchGpusResponse{Type: EventDeleted, Object: s.gpus[name]})
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gpus, s.order = gpus, order
	if len(events) == 0 {
		return
	}
	for w := range s.watchers {
		for _, ev := range events {
			if !w.offer(ev) {
				s.dropLocked(w, status.Errorf(codes.ResourceExhausted,
					"the watch fell %d events behind the GPUs' changes and was dropped; list or watch again", s.opts.WatchBuffer))
				s.logger.Info("Dropped a Device API watcher that fell behind", "buffer", s.opts.WatchBuffer)
				break
			}
		}
	}
}

// stop ends every watcher and refuses new ones.
func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for w := range s.watchers {
		s.dropLocked(w, errStopped)
	}
}

// waitReady waits until Run has converted the first snapshot.
func (s *Server) waitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// errStopped is what calls get once Run has returned.
var errStopped = status.Error(codes.Unavailable, "the Device API server is stopping")

// list returns the current Gpus in order.
func (s *Server) list() ([]*v1alpha1.Gpu, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errStopped
	}
	return s.listLocked(), nil
}

func (s *Server) listLocked() []*v1alpha1.Gpu {
	out := make([]*v1alpha1.Gpu, 0, len(s.order))
	for _, name := range s.order {
		out = append(out, s.gpus[name])
	}
	return out
}

// get returns the Gpu named name, or the GPU whose UUID it is in any case.
func (s *Server) get(name string) (*v1alpha1.Gpu, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errStopped
	}
	g, ok := s.gpus[Name(name)]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no GPU named %q on this node", name)
	}
	return g, nil
}
