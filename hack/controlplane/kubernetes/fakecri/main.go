// Command fakecri serves the Container Runtime Interface from k8s.io/cri-client's fake runtime,
// as kubemark's hollow nodes do, so that a real kubelet runs pods without real containers: fast,
// no images, no cgroups. The test harness starts one per kubelet node.
//
// Three gaps of the upstream fake are closed here, each of which the kubelet trips over:
//   - images need a size and the image filesystem a usage entry, or the kubelet rejects them
//     ("Id or size of image ... is not set") and its image GC complains about capacity 0;
//   - containers need a log path: the kubelet's log cleanup otherwise removes files in its working
//     directory, and `kubectl logs` has nothing to read. Each container gets a CRI-format log file
//     under the sandbox's log directory with one line saying it started;
//   - the fake records every call in a slice forever; it is trimmed so a long-running node keeps a
//     flat memory profile.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// runtime wraps the upstream fake and fills in what the kubelet needs.
type runtime struct {
	*fake.RemoteRuntime
	imageFSDir string
}

// CreateContainer gives every container a log file the kubelet and `kubectl logs` can read.
func (r *runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	logDir := req.GetSandboxConfig().GetLogDirectory()
	relPath := req.GetConfig().GetLogPath()
	if logDir == "" || relPath == "" {
		return resp, nil
	}
	logPath := filepath.Join(logDir, relPath)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("container log directory: %w", err)
	}
	if err := os.WriteFile(logPath, []byte(startLog(req.GetConfig(), time.Now())), 0o644); err != nil {
		return nil, fmt.Errorf("container log: %w", err)
	}
	svc := r.RuntimeService
	svc.Lock()
	if c, ok := svc.Containers[resp.ContainerId]; ok {
		c.LogPath = logPath
	}
	svc.Unlock()
	return resp, nil
}

// startLog is what a fake container "prints": its name and image, then what the kubelet handed
// the runtime for it from device plugins and DRA drivers (environment set by Allocate, CDI
// devices, device nodes, mounts outside the kubelet's own), in CRI log format. Tests read it
// with `kubectl logs` to see what a device plugin's Allocate really returned to the kubelet.
func startLog(cfg *runtimeapi.ContainerConfig, now time.Time) string {
	ts := now.UTC().Format(time.RFC3339Nano)
	var b strings.Builder
	fmt.Fprintf(&b, "%s stdout F fake container %s started (image %s)\n", ts, cfg.GetMetadata().GetName(), cfg.GetImage().GetImage())
	var envs []string
	for _, kv := range cfg.GetEnvs() {
		// The kubelet's service-link variables say nothing about devices.
		if !strings.HasPrefix(kv.GetKey(), "KUBERNETES_") {
			envs = append(envs, kv.GetKey()+"="+string(kv.GetValue()))
		}
	}
	slices.Sort(envs)
	for _, kv := range envs {
		fmt.Fprintf(&b, "%s stdout F env %s\n", ts, kv)
	}
	for _, d := range cfg.GetCDIDevices() {
		fmt.Fprintf(&b, "%s stdout F cdi %s\n", ts, d.GetName())
	}
	for _, d := range cfg.GetDevices() {
		fmt.Fprintf(&b, "%s stdout F device %s\n", ts, d.GetContainerPath())
	}
	return b.String()
}

// trimCalls drops the fake's call record, which otherwise grows with every kubelet sync.
func (r *runtime) trimCalls() {
	r.RuntimeService.Lock()
	r.RuntimeService.Called = r.RuntimeService.Called[:0]
	r.RuntimeService.Unlock()
	r.ImageService.Lock()
	r.ImageService.Called = r.ImageService.Called[:0]
	r.ImageService.Unlock()
}

func main() {
	endpoint := flag.String("endpoint", "", "unix socket to serve the CRI on, e.g. unix:///path/cri.sock")
	imageFS := flag.String("image-fs-dir", "", "directory reported as the image filesystem (created if missing)")
	flag.Parse()
	if err := run(*endpoint, *imageFS); err != nil {
		fmt.Fprintln(os.Stderr, "fakecri:", err)
		os.Exit(1)
	}
}

func run(endpoint, imageFS string) error {
	if endpoint == "" || imageFS == "" {
		return fmt.Errorf("--endpoint and --image-fs-dir are required")
	}
	if err := os.MkdirAll(imageFS, 0o755); err != nil {
		return err
	}
	r := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), imageFSDir: imageFS}
	r.ImageService.SetFakeImageSize(64 << 20)
	usage := []*runtimeapi.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: imageFS},
		UsedBytes:  &runtimeapi.UInt64Value{Value: 64 << 20},
		InodesUsed: &runtimeapi.UInt64Value{Value: 16},
	}}
	r.ImageService.SetFakeFilesystemUsage(usage)
	r.ImageService.SetFakeContainerFilesystemUsage(usage)
	r.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	r.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS}

	listener, err := util.CreateListener(endpoint)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", endpoint, err)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, r)
	runtimeapi.RegisterImageServiceServer(server, r)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		ticker := time.NewTicker(time.Minute)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				server.Stop()
				return
			case <-ticker.C:
				r.trimCalls()
			}
		}
	}()
	return server.Serve(listener)
}
