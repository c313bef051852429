package deviceplugin

import (
	"cmp"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// VisibleDevicesEnv is the variable the NVIDIA container toolkit reads to choose the GPUs of a
// container; Allocate sets it to the allocated UUIDs.
const VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

// DefaultCDIKind is the CDI kind of NVIDIA GPUs: a GPU is the CDI device nvidia.com/gpu=<UUID>.
const DefaultCDIKind = "nvidia.com/gpu"

// Source is where a Service reads health from; *health.Monitor is one.
type Source interface {
	// Subscribe returns a subscription that starts with the current snapshot pending.
	Subscribe() *health.Subscription
	// Snapshot returns the latest snapshot.
	Snapshot() health.Snapshot
}

var _ Source = (*health.Monitor)(nil)

// ServiceOptions configure a Service.
type ServiceOptions struct {
	Options
	// CDI makes Allocate return CDI device names (CDIKind=<UUID>) instead of the
	// NVIDIA_VISIBLE_DEVICES variable.
	CDI bool
	// CDIKind is the CDI kind of the devices (default nvidia.com/gpu).
	CDIKind string
}

// Service implements the kubelet's DevicePlugin gRPC service on a health Source.
type Service struct {
	pluginapi.UnimplementedDevicePluginServer
	src  Source
	opts ServiceOptions
}

var _ pluginapi.DevicePluginServer = (*Service)(nil)

// NewService returns a Service reading health from src.
func NewService(src Source, opts ServiceOptions) *Service {
	if opts.CDIKind == "" {
		opts.CDIKind = DefaultCDIKind
	}
	return &Service{src: src, opts: opts}
}

// Register adds the service to a gRPC server.
func (s *Service) Register(srv *grpc.Server) { pluginapi.RegisterDevicePluginServer(srv, s) }

// PluginOptions are the options the kubelet learns at registration and from
// GetDevicePluginOptions.
func (s *Service) PluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (s *Service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return s.PluginOptions(), nil
}

// ListAndWatch implements pluginapi.DevicePluginServer: it sends the device list at once, then a
// new list whenever a device's health (as the kubelet sees it) changes, until the kubelet goes
// away or the server stops. Changes that arrive faster than the stream takes them coalesce into
// the latest list: the kubelet needs the current state, not every step.
func (s *Service) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	ctx := stream.Context()
	logger := klog.FromContext(ctx)
	sub := s.src.Subscribe()
	defer sub.Close()
	var last []*pluginapi.Device
	sent := false
	for {
		u, ok := sub.Wait(ctx)
		if !ok {
			return nil
		}
		devs := Devices(u.Snapshot, s.opts.Options)
		if sent && Equal(devs, last) {
			continue
		}
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		logger.V(2).Info("Sent device list", "devices", len(devs), "unhealthy", Unhealthy(devs))
		for _, t := range u.Transitions {
			if s.opts.selects(t.Device) {
				logger.Info("GPU health changed", "gpu", t.Device.UUID, "index", t.Device.Index,
					"from", t.From.String(), "to", t.To.String(), "reason", t.Reason)
			}
		}
		last, sent = devs, true
	}
}

// Allocate implements pluginapi.DevicePluginServer. Every requested ID must be an advertised
// device; the container gets the GPUs by UUID, never by index.
func (s *Service) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	known := s.known()
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := cr.GetDevicesIds()
		if len(ids) == 0 {
			return nil, status.Error(codes.InvalidArgument, "allocate: a container request with no devices")
		}
		for _, id := range ids {
			if _, ok := known[id]; !ok {
				return nil, status.Errorf(codes.InvalidArgument, "allocate: unknown device %q", id)
			}
		}
		// Replicas of one GPU are one GPU to the container.
		gpus := gpusOf(ids)
		car := &pluginapi.ContainerAllocateResponse{}
		if s.opts.CDI {
			for _, uuid := range gpus {
				car.CdiDevices = append(car.CdiDevices, &pluginapi.CDIDevice{Name: s.opts.CDIKind + "=" + uuid})
			}
		} else {
			car.Envs = map[string]string{VisibleDevicesEnv: strings.Join(gpus, ",")}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, car)
	}
	return resp, nil
}

// PreStartContainer implements pluginapi.DevicePluginServer; the plugin does not ask for it, so
// it has nothing to do.
func (s *Service) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer with Preferred.
func (s *Service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	known := s.known()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := Preferred(known, s.opts.NUMANode, cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// known returns the advertised devices of the latest snapshot by ID (each replica ID maps to
// its GPU).
func (s *Service) known() map[string]health.DeviceStatus {
	snap := s.src.Snapshot()
	m := make(map[string]health.DeviceStatus, len(snap.Devices))
	for _, d := range snap.Devices {
		if s.opts.selects(d.Device) {
			for _, id := range s.opts.deviceIDs(d.Device.UUID) {
				m[id] = d
			}
		}
	}
	return m
}

// Preferred chooses size devices out of available: every device of mustInclude first, then the
// healthiest (Healthy before Degraded, unknown IDs last), packed onto as few NUMA nodes as
// possible (the NUMA node of mustInclude, else the smallest node that fits the rest, keeping
// bigger nodes free for bigger requests), then by GPU index. Replicas of time-sliced GPUs
// (ReplicaID) go one at a time to the GPU with the fewest replicas in use, as NVIDIA's plugin
// distributes them. numa may be nil.
func Preferred(known map[string]health.DeviceStatus, numa func(health.Device) (int, bool), available, mustInclude []string, size int) []string {
	out := make([]string, 0, max(size, len(mustInclude)))
	chosen := map[string]bool{}
	for _, id := range mustInclude {
		if !chosen[id] {
			out, chosen[id] = append(out, id), true
		}
	}
	need := size - len(out)
	if need <= 0 {
		return out
	}
	node := func(id string) int {
		if d, ok := known[id]; ok && numa != nil {
			if n, ok := numa(d.Device); ok {
				return n
			}
		}
		return -1
	}
	var cands []string
	perNode := map[int]int{}
	for _, id := range available {
		if !chosen[id] {
			cands, chosen[id] = append(cands, id), true
			perNode[node(id)]++
		}
	}
	nodeRank := nodeOrder(perNode, need, mustInclude, node)
	rank := func(id string) int {
		d, ok := known[id]
		switch {
		case !ok || d.Health == health.Unhealthy:
			return 2
		case d.Health == health.Degraded:
			return 1
		}
		return 0
	}
	index := func(id string) int {
		if d, ok := known[id]; ok {
			return d.Device.Index
		}
		return int(^uint(0) >> 1)
	}
	// Time-sliced replicas go to the least loaded GPU, one at a time, as NVIDIA's plugin does
	// (internal/rm/allocate.go, greedyAlloc with its default "distributed" policy): picking the
	// round-th replica of a GPU leaves it with allocated+round replicas in use, so sorting by that
	// (then by round) is the same greedy choice. Whole GPUs: both are 0.
	round, free, total := map[string]int{}, map[string]int{}, map[string]int{}
	for _, id := range cands {
		round[id] = free[GPUOf(id)]
		free[GPUOf(id)]++
	}
	for id := range known {
		total[GPUOf(id)]++
	}
	load := func(id string) int { return max(total[GPUOf(id)]-free[GPUOf(id)], 0) + round[id] }
	slices.SortStableFunc(cands, func(a, b string) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(nodeRank[node(a)], nodeRank[node(b)]),
			cmp.Compare(load(a), load(b)), cmp.Compare(round[a], round[b]),
			cmp.Compare(index(a), index(b)), strings.Compare(a, b))
	})
	return append(out, cands[:min(need, len(cands))]...)
}

// nodeOrder ranks NUMA nodes for packing: the nodes of the must-include devices first, then the
// smallest node with room for the whole request, then the rest from the biggest down.
func nodeOrder(perNode map[int]int, need int, mustInclude []string, node func(string) int) map[int]int {
	nodes := make([]int, 0, len(perNode))
	for n := range perNode {
		nodes = append(nodes, n)
	}
	pinned := map[int]bool{}
	for _, id := range mustInclude {
		pinned[node(id)] = true
	}
	fits := func(n int) bool { return perNode[n] >= need }
	slices.SortFunc(nodes, func(a, b int) int {
		switch {
		case pinned[a] != pinned[b]:
			if pinned[a] {
				return -1
			}
			return 1
		case fits(a) != fits(b):
			if fits(a) {
				return -1
			}
			return 1
		case fits(a):
			return cmp.Or(cmp.Compare(perNode[a], perNode[b]), cmp.Compare(a, b))
		}
		return cmp.Or(cmp.Compare(perNode[b], perNode[a]), cmp.Compare(a, b))
	})
	rank := make(map[int]int, len(nodes))
	for i, n := range nodes {
		rank[n] = i
	}
	return rank
}

// SysfsNUMA returns an Options.NUMANode that reads a GPU's NUMA node from sysfs under root
// (normally "/sys"), through its PCI bus ID. A device without a bus ID, or a kernel that
// reports no NUMA affinity (-1), has no known node.
func SysfsNUMA(root string) func(health.Device) (int, bool) {
	return func(d health.Device) (int, bool) {
		if d.PCIBusID == "" {
			return 0, false
		}
		b, err := os.ReadFile(filepath.Join(root, "bus", "pci", "devices", sysfsPCIAddress(d.PCIBusID), "numa_node"))
		if err != nil {
			return 0, false
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || n < 0 {
			return 0, false
		}
		return n, true
	}
}
