// Package nvsentineltest is a platform-connector of gpuhealth's own, written from NVSentinel's
// interface: a PlatformConnector gRPC server on a Unix socket that records every batch it
// accepts, for tests of anything that sends to NVSentinel. As NVSentinel's server does, it
// removes a socket file left behind before it listens, makes its socket 0666, and refuses a whole
// batch in which an event asks for CUSTOM without naming the action.
package nvsentineltest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
)

// Server is a running platform-connector.
type Server struct {
	datamodels.UnimplementedPlatformConnectorServer
	path   string
	lis    *net.UnixListener
	grpc   *grpc.Server
	served chan struct{} // closed when Serve returned

	mu      sync.Mutex
	batches [][]*datamodels.HealthEvent
	refuse  int
	changed chan struct{} // closed and replaced when a batch arrives
}

// Start serves on the Unix socket path, replacing a socket file left there.
func Start(path string) (*Server, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove the old socket: %w", err)
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o666); err != nil {
		lis.Close()
		return nil, err
	}
	s := &Server{path: path, lis: lis, grpc: grpc.NewServer(), served: make(chan struct{}), changed: make(chan struct{})}
	datamodels.RegisterPlatformConnectorServer(s.grpc, s)
	go func() {
		defer close(s.served)
		_ = s.grpc.Serve(lis)
	}()
	return s, nil
}

// Stop ends the server as a crash would: connections close and the socket file stays behind,
// for the next Start to replace. It returns once the server has stopped.
func (s *Server) Stop() {
	s.lis.SetUnlinkOnClose(false)
	s.grpc.Stop()
	<-s.served
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Refuse makes the next n batches fail with Unavailable, as an overloaded server's would.
func (s *Server) Refuse(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = n
}

// HealthEventOccurredV1 implements datamodels.PlatformConnectorServer.
func (s *Server) HealthEventOccurredV1(_ context.Context, in *datamodels.HealthEvents) (*emptypb.Empty, error) {
	for _, ev := range in.GetEvents() {
		if ev.GetRecommendedAction() == datamodels.RecommendedAction_CUSTOM && ev.GetCustomRecommendedAction() == "" {
			return nil, status.Error(codes.InvalidArgument, "recommendedAction CUSTOM needs customRecommendedAction")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse > 0 {
		s.refuse--
		return nil, status.Error(codes.Unavailable, "refused by the test")
	}
	batch := make([]*datamodels.HealthEvent, len(in.GetEvents()))
	for i, ev := range in.GetEvents() {
		batch[i] = proto.Clone(ev).(*datamodels.HealthEvent)
	}
	s.batches = append(s.batches, batch)
	close(s.changed)
	s.changed = make(chan struct{})
	return &emptypb.Empty{}, nil
}

// Batches returns the batches accepted so far, in order.
func (s *Server) Batches() [][]*datamodels.HealthEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.batches)
}

// Events returns every event accepted so far, in order.
func (s *Server) Events() []*datamodels.HealthEvent {
	return slices.Concat(s.Batches()...)
}

// Wait blocks until done holds for the events accepted so far, or ctx ends; it returns the
// events done was last called with.
func (s *Server) Wait(ctx context.Context, done func([]*datamodels.HealthEvent) bool) ([]*datamodels.HealthEvent, error) {
	for {
		s.mu.Lock()
		events, changed := slices.Concat(s.batches...), s.changed
		s.mu.Unlock()
		if done(events) {
			return events, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return events, ctx.Err()
		}
	}
}

// Describe is an event as NVSentinel's rules and clearing keys read it, for tests to compare:
// "fatal GpuHealthXID [79] [GPU:3 PCI:0000:13:00 GPU_UUID:GPU-…] RESTART_BM", with " drain-skip"
// when it asks node-drainer to skip; the kind is fatal, non-fatal or healthy.
func Describe(ev *datamodels.HealthEvent) string {
	kind := "non-fatal"
	switch {
	case ev.GetIsHealthy() && ev.GetIsFatal():
		kind = "healthy-and-fatal"
	case ev.GetIsHealthy():
		kind = "healthy"
	case ev.GetIsFatal():
		kind = "fatal"
	}
	entities := make([]string, 0, len(ev.GetEntitiesImpacted()))
	for _, e := range ev.GetEntitiesImpacted() {
		entities = append(entities, e.GetEntityType()+":"+e.GetEntityValue())
	}
	s := fmt.Sprintf("%s %s %v [%s] %s", kind, ev.GetCheckName(), ev.GetErrorCode(), strings.Join(entities, " "), ev.GetRecommendedAction())
	if ev.GetDrainOverrides().GetSkip() {
		s += " drain-skip"
	}
	return s
}
