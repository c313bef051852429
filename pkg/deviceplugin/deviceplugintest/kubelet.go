// Package deviceplugintest is a kubelet for device-plugin tests. It serves the kubelet's
// Registration service on kubelet.sock in a device-plugins directory and, for every plugin that
// registers, does what the kubelet's device manager does: it dials the plugin's socket during
// the Register call, asks for the plugin's options, and keeps a ListAndWatch stream open,
// recording every device list the plugin sends. Tests call Allocate and GetPreferredAllocation
// on the same client the kubelet uses.
//
// It talks to plugins over real gRPC on Unix sockets; nothing of the plugin is faked.
package deviceplugintest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// KubeletSocket is the name of the kubelet's registration socket.
const KubeletSocket = "kubelet.sock"

// connectTimeout bounds the kubelet's calls to a plugin while it registers.
const connectTimeout = 10 * time.Second

// Options configure a Kubelet.
type Options struct {
	// KeepSockets leaves the directory alone at start. By default Start removes everything in
	// it, as the kubelet's device manager does at every start, so a restarted Kubelet also
	// removes the plugins' sockets.
	KeepSockets bool
}

// Kubelet is a test kubelet. Stop it when done.
type Kubelet struct {
	dir  string
	srv  *grpc.Server
	regs chan *Plugin

	mu      sync.Mutex
	plugins []*Plugin
}

// Start removes what is in dir (unless opts.KeepSockets), then serves the Registration service
// on dir/kubelet.sock.
func Start(dir string, opts Options) (*Kubelet, error) {
	if !opts.KeepSockets {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, err
			}
		}
	}
	sock := filepath.Join(dir, KubeletSocket)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "unix", sock)
	if err != nil {
		return nil, err
	}
	k := &Kubelet{dir: dir, srv: grpc.NewServer(), regs: make(chan *Plugin, 64)}
	pluginapi.RegisterRegistrationServer(k.srv, registration{k: k})
	go func() { _ = k.srv.Serve(lis) }() // returns when Stop closes the listener
	return k, nil
}

// Stop stops serving, removes kubelet.sock and closes the connections to every plugin.
func (k *Kubelet) Stop() {
	k.srv.Stop()
	_ = os.Remove(filepath.Join(k.dir, KubeletSocket))
	k.mu.Lock()
	plugins := k.plugins
	k.plugins = nil
	k.mu.Unlock()
	for _, p := range plugins {
		p.close()
	}
}

// Registered returns the next plugin that registers, or an error when ctx ends first.
func (k *Kubelet) Registered(ctx context.Context) (*Plugin, error) {
	select {
	case p := <-k.regs:
		return p, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("no plugin registered: %w", ctx.Err())
	}
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	k *Kubelet
}

// Register does what the kubelet's device manager does: check the request, connect to the
// plugin before answering, and watch its devices from then on.
func (r registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if !slices.Contains(pluginapi.SupportedVersions[:], req.GetVersion()) {
		return nil, fmt.Errorf("unsupported device plugin API version %q", req.GetVersion())
	}
	if req.GetResourceName() == "" || req.GetEndpoint() == "" {
		return nil, errors.New("resource name and endpoint are required")
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(r.k.dir, req.GetEndpoint()),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	client := pluginapi.NewDevicePluginClient(conn)
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	opts, err := client.GetDevicePluginOptions(cctx, &pluginapi.Empty{})
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("GetDevicePluginOptions: %w", err)
	}
	sctx, stop := context.WithCancel(context.Background())
	stream, err := client.ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		stop()
		_ = conn.Close()
		return nil, fmt.Errorf("ListAndWatch: %w", err)
	}
	p := &Plugin{Request: req, Options: opts, Client: client, conn: conn, stop: stop,
		changed: make(chan struct{}), done: make(chan struct{})}
	go p.watch(stream)
	r.k.mu.Lock()
	r.k.plugins = append(r.k.plugins, p)
	r.k.mu.Unlock()
	r.k.regs <- p
	return &pluginapi.Empty{}, nil
}

// Plugin is the kubelet's side of one registration.
type Plugin struct {
	// Request is what the plugin sent to Register.
	Request *pluginapi.RegisterRequest
	// Options is what GetDevicePluginOptions returned.
	Options *pluginapi.DevicePluginOptions
	// Client is the kubelet's connection to the plugin.
	Client pluginapi.DevicePluginClient

	conn *grpc.ClientConn
	stop context.CancelFunc

	mu      sync.Mutex
	lists   [][]*pluginapi.Device
	changed chan struct{} // closed and replaced at every list and at the stream's end
	err     error
	done    chan struct{} // closed when the ListAndWatch stream ends
}

func (p *Plugin) watch(stream grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse]) {
	for {
		resp, err := stream.Recv()
		p.mu.Lock()
		if err != nil {
			p.err = err
			close(p.changed)
			close(p.done)
			p.mu.Unlock()
			return
		}
		p.lists = append(p.lists, resp.GetDevices())
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
}

func (p *Plugin) close() {
	p.stop()
	_ = p.conn.Close()
}

// Lists returns every device list received so far, oldest first.
func (p *Plugin) Lists() [][]*pluginapi.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lists)
}

// Done is closed when the ListAndWatch stream ends; Err then says why.
func (p *Plugin) Done() <-chan struct{} { return p.done }

// Err is why the ListAndWatch stream ended, nil while it is open.
func (p *Plugin) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// WaitFor waits until the latest device list satisfies cond and returns that list. It fails
// when ctx ends or the stream ends first.
func (p *Plugin) WaitFor(ctx context.Context, cond func([]*pluginapi.Device) bool) ([]*pluginapi.Device, error) {
	for {
		p.mu.Lock()
		changed, err := p.changed, p.err
		var last []*pluginapi.Device
		have := len(p.lists) > 0
		if have {
			last = p.lists[len(p.lists)-1]
		}
		p.mu.Unlock()
		if have && cond(last) {
			return last, nil
		}
		if err != nil {
			return nil, fmt.Errorf("ListAndWatch ended: %w", err)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("device list never satisfied the condition (last: %v): %w", Describe(last), ctx.Err())
		}
	}
}

// Describe formats a device list as "ID=Health" pairs, for failure messages.
func Describe(devs []*pluginapi.Device) []string {
	out := make([]string, 0, len(devs))
	for _, d := range devs {
		out = append(out, d.GetID()+"="+d.GetHealth())
	}
	return out
}

// Health returns a device list as a map from ID to health.
func Health(devs []*pluginapi.Device) map[string]string {
	m := make(map[string]string, len(devs))
	for _, d := range devs {
		m[d.GetID()] = d.GetHealth()
	}
	return m
}
