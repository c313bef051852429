package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Defaults of PluginOptions.
const (
	DefaultResourceName    = "nvidia.com/gpu"
	DefaultDir             = pluginapi.DevicePluginPath
	DefaultPollInterval    = time.Second
	DefaultRegisterTimeout = 10 * time.Second
	kubeletSocketName      = "kubelet.sock"
)

// PluginOptions configure a Plugin.
type PluginOptions struct {
	// ResourceName is the extended resource the plugin serves (default nvidia.com/gpu).
	ResourceName string
	// Dir is the kubelet's device-plugins directory, holding kubelet.sock (default
	// /var/lib/kubelet/device-plugins).
	Dir string
	// Socket is the file name of the plugin's socket in Dir (default gpuhealth-<resource>.sock,
	// "gpuhealth-gpu.sock" for nvidia.com/gpu).
	Socket string
	// PollInterval is how often the plugin checks that the kubelet has not restarted and that its
	// socket is still there, and how long it waits between registration attempts (default 1s).
	PollInterval time.Duration
	// RegisterTimeout bounds one Register call (default 10s).
	RegisterTimeout time.Duration
}

// Plugin runs a Service as a kubelet device plugin.
type Plugin struct {
	svc  *Service
	opts PluginOptions
}

// NewPlugin returns a Plugin serving svc.
func NewPlugin(svc *Service, opts PluginOptions) *Plugin {
	if opts.ResourceName == "" {
		opts.ResourceName = DefaultResourceName
	}
	if opts.Dir == "" {
		opts.Dir = DefaultDir
	}
	if opts.Socket == "" {
		opts.Socket = "gpuhealth-" + opts.ResourceName[strings.LastIndex(opts.ResourceName, "/")+1:] + ".sock"
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.RegisterTimeout <= 0 {
		opts.RegisterTimeout = DefaultRegisterTimeout
	}
	return &Plugin{svc: svc, opts: opts}
}

// SocketPath is the path of the plugin's socket.
func (p *Plugin) SocketPath() string { return filepath.Join(p.opts.Dir, p.opts.Socket) }

// KubeletSocketPath is the path of the kubelet's registration socket.
func (p *Plugin) KubeletSocketPath() string { return filepath.Join(p.opts.Dir, kubeletSocketName) }

// errRestart ends one serving round: the kubelet restarted, or the plugin's socket went away.
var errRestart = errors.New("kubelet restarted")

// Run serves the plugin until ctx ends, then stops the server and removes its socket.
//
// Each round serves the DevicePlugin service on a fresh socket, waits for kubelet.sock, and
// registers. The kubelet forgets its plugins when it restarts: it clears the device-plugins
// directory (removing the plugin's socket) and creates a new kubelet.sock. Run watches for both,
// the way the NVIDIA device plugin does, and starts a new round when either happens.
func (p *Plugin) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("resource", p.opts.ResourceName, "socket", p.SocketPath())
	ctx = klog.NewContext(ctx, logger)
	for {
		err := p.round(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errRestart):
			logger.Info("Kubelet restarted or the plugin socket disappeared; serving and registering again")
		default:
			return err
		}
	}
}

// round serves and registers once, and returns errRestart when the kubelet restarted, nil when
// ctx ended, or why serving failed.
func (p *Plugin) round(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	sock := p.SocketPath()
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := (&net.ListenConfig{}).Listen(ctx, "unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	ours, err := os.Stat(sock)
	if err != nil {
		_ = lis.Close()
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unaryLogger(logger)), grpc.ChainStreamInterceptor(streamLogger(logger)))
	p.svc.Register(srv)

	g, gctx := errgroup.WithContext(ctx)
	// Serve returns when the watcher below stops the server; it owns lis from here.
	g.Go(func() error {
		// Serve reports ErrServerStopped when the server was stopped before it started.
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		defer srv.Stop()
		kubelet, err := p.register(gctx)
		if err != nil {
			return err
		}
		logger.Info("Registered with the kubelet")
		return p.watch(gctx, ours, kubelet)
	})
	err = g.Wait()
	if rerr := os.Remove(sock); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
		err = rerr
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// register waits for kubelet.sock and registers, retrying until it succeeds or ctx ends. It
// returns the identity of the kubelet.sock it registered through.
func (p *Plugin) register(ctx context.Context) (os.FileInfo, error) {
	logger := klog.FromContext(ctx)
	for attempt := 0; ; attempt++ {
		fi, err := os.Stat(p.KubeletSocketPath())
		if err == nil {
			if err = p.registerOnce(ctx); err == nil {
				return fi, nil
			}
		}
		if attempt%30 == 0 {
			logger.Info("Waiting to register with the kubelet", "kubeletSocket", p.KubeletSocketPath(), "err", err)
		}
		// Our own socket may have gone while we waited: start over with a new one.
		if _, serr := os.Stat(p.SocketPath()); serr != nil {
			return nil, errRestart
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(p.opts.PollInterval):
		}
	}
}

func (p *Plugin) registerOnce(ctx context.Context) error {
	// "unix:" takes relative paths too ("unix://" would read a relative path's first element as
	// an authority): --kubelet-socket-dir .cluster/nodes/NAME/device-plugins must work.
	conn, err := grpc.NewClient("unix:"+p.KubeletSocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, p.opts.RegisterTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.opts.Socket,
		ResourceName: p.opts.ResourceName,
		Options:      p.svc.PluginOptions(),
	})
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	return nil
}

// watch returns errRestart once the plugin's socket is gone or replaced, or kubelet.sock is
// replaced (a missing kubelet.sock alone is a kubelet still starting: keep waiting), and nil when
// ctx ends.
func (p *Plugin) watch(ctx context.Context, ours, kubelet os.FileInfo) error {
	t := time.NewTicker(p.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if fi, err := os.Stat(p.SocketPath()); err != nil || !sameSocket(fi, ours) {
			return errRestart
		}
		if fi, err := os.Stat(p.KubeletSocketPath()); err == nil && !sameSocket(fi, kubelet) {
			return errRestart
		}
	}
}

// sameSocket tells a socket file from one created in its place. The inode alone does not: a
// file system may hand a new socket the inode of the one just removed; the creation time
// (the modification time of a socket file) tells them apart.
func sameSocket(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime())
}

// unaryLogger and streamLogger give each call the plugin's logger, so klog.FromContext works in
// the service.
func unaryLogger(logger logr.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(klog.NewContext(ctx, logger), req)
		if err != nil {
			logger.Error(err, "Device plugin call failed", "method", info.FullMethod)
		}
		return resp, err
	}
}

func streamLogger(logger logr.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, loggedStream{ServerStream: ss, ctx: klog.NewContext(ss.Context(), logger)})
	}
}

type loggedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s loggedStream) Context() context.Context { return s.ctx }
