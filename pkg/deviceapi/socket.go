package deviceapi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// Socket modes: the agent's user alone, or its group too.
const (
	SocketMode      fs.FileMode = 0o600
	GroupSocketMode fs.FileMode = 0o660
)

// ShutdownTimeout bounds how long Serve waits for calls in flight once its context ends; a
// stream still blocked on a client that does not read is then cut.
const ShutdownTimeout = 5 * time.Second

// maxRequest bounds a request's size: the largest holds one GPU's name.
const maxRequest = 16 << 10

// handshakeTimeout bounds how long a new connection may take to start speaking HTTP/2: a
// client on the same node does it at once, and one that never does would otherwise hold the
// server's stop for gRPC's default of two minutes.
const handshakeTimeout = 2 * time.Second

// SocketOptions say where and for whom ServeSocket listens.
type SocketOptions struct {
	// Path is the socket's path; its directory is created (0755) when missing.
	Path string
	// Group, when set, owns the socket and may connect (GroupSocketMode): a group name or a
	// numeric GID. Without it only the server's own user may (SocketMode). Changing a socket's
	// group needs the process to belong to the group, or CAP_CHOWN.
	Group string
}

// Listen creates the socket o names with its final owner and mode before anyone can connect: it
// binds in a fresh directory only this user may enter, sets the group and mode there, then
// renames the socket into place, replacing a socket left there before (a file that is not a
// socket is refused). Closing the listener removes the socket, unless another has replaced it.
func Listen(o SocketOptions) (net.Listener, error) {
	gid, mode := -1, SocketMode
	if o.Group != "" {
		var err error
		if gid, err = LookupGroup(o.Group); err != nil {
			return nil, err
		}
		mode = GroupSocketMode
	}
	switch st, err := os.Lstat(o.Path); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("device API socket: %w", err)
	case st.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("device API socket: %s is there and is not a socket: not replacing it", o.Path)
	}
	dir := filepath.Dir(o.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("device API socket directory: %w", err)
	}
	private, err := os.MkdirTemp(dir, "."+filepath.Base(o.Path)+".")
	if err != nil {
		return nil, fmt.Errorf("device API socket: %w", err)
	}
	defer os.RemoveAll(private)
	bound := filepath.Join(private, "s")
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: bound, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("device API socket: %w", err)
	}
	// The socket leaves the path it was bound at: removing it is sock.Close's job.
	lis.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		_ = lis.Close()
		return nil, fmt.Errorf("device API socket %s: %w", o.Path, err)
	}
	if gid >= 0 {
		if err := os.Lchown(bound, -1, gid); err != nil {
			return fail(fmt.Errorf("giving it to group %s (the process must belong to the group or hold CAP_CHOWN): %w", o.Group, err))
		}
	}
	// The mode net.Listen gave depends on the umask: set the one that is meant.
	if err := os.Chmod(bound, mode); err != nil {
		return fail(err)
	}
	if err := os.Rename(bound, o.Path); err != nil {
		return fail(err)
	}
	ours, err := os.Lstat(o.Path)
	if err != nil {
		return fail(err)
	}
	return &socket{UnixListener: lis, path: o.Path, ours: ours}, nil
}

// socket is a listener on a socket file that it removes when closed, if the file is still its
// own: a server that replaced it keeps its socket.
type socket struct {
	*net.UnixListener
	path string
	ours os.FileInfo
}

func (s *socket) Addr() net.Addr { return &net.UnixAddr{Name: s.path, Net: "unix"} }

func (s *socket) Close() error {
	err := s.UnixListener.Close()
	if st, serr := os.Lstat(s.path); serr == nil && os.SameFile(st, s.ours) {
		if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
			err = rerr
		}
	}
	return err
}

// LookupGroup returns the GID of group, a numeric GID or a group name (looked up in the
// system's group database where the process runs).
func LookupGroup(group string) (int, error) {
	if gid, err := strconv.ParseUint(group, 10, 32); err == nil {
		return int(gid), nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("device API socket group: %w", err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("device API socket group %s: GID %q: %w", group, g.Gid, err)
	}
	return gid, nil
}

// ServeSocket serves s on the socket o names (Listen) until ctx ends, and removes the socket
// when it stops.
func (s *Server) ServeSocket(ctx context.Context, o SocketOptions) error {
	lis, err := Listen(o)
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Serving NVIDIA's Device API", "socket", o.Path, "group", o.Group)
	return s.Serve(ctx, lis)
}

// Serve runs s (Run) and a gRPC server of its service on lis until ctx ends or serving fails,
// then stops both: watches end (UNAVAILABLE), calls in flight get ShutdownTimeout to finish.
// lis is closed when Serve returns.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxRequest), grpc.ConnectionTimeout(handshakeTimeout))
	s.Register(srv)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.Run(gctx) })
	g.Go(func() error {
		// Serve closes lis when it returns; it reports ErrServerStopped when stopped first.
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("device API: serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		stopWithin(srv, ShutdownTimeout)
		return nil
	})
	return g.Wait()
}

// stopWithin stops srv gracefully, and at once after d.
func stopWithin(srv *grpc.Server, d time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.GracefulStop()
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		srv.Stop()
		<-done
	}
}
