package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// DRAPlugin is a minimal DRA kubelet plugin for the gpu.nvidia.com driver on a real node: it
// registers with the node's kubelet through plugins_registry, and answers NodePrepareResources
// and NodeUnprepareResources for every claim allocated on the node (no CDI devices: the fake CRI
// runs no containers). It stands in for NVIDIA's DRA driver where what a test depends on is the
// kubelet's side of DRA (prepare before the pod starts, unprepare after it is gone). It reports
// no device health; ResourceSlices are the test's to create (GPUResourceSlice).
type DRAPlugin struct {
	helper *kubeletplugin.Helper

	mu         sync.Mutex
	prepared   map[types.UID]string // claim UID → namespace/name
	unprepared []string             // namespace/name, in order
}

// StartDRAPlugin registers a DRAPlugin for driver GPUDriver with node's kubelet and returns once
// the kubelet has accepted the registration. Stop it with Stop.
func (c *Cluster) StartDRAPlugin(ctx context.Context, node *KubeletNode) (*DRAPlugin, error) {
	cfg, err := c.NodeConfig(node.Name)
	if err != nil {
		return nil, err
	}
	client, err := newClientset(cfg, "system:node:"+node.Name)
	if err != nil {
		return nil, err
	}
	dataDir := filepath.Join(node.PluginsDir(), GPUDriver)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, fmt.Errorf("DRA plugin directory: %w", err)
	}
	p := &DRAPlugin{prepared: map[types.UID]string{}}
	logger := klog.FromContext(ctx).WithValues("driver", GPUDriver, "node", node.Name)
	helper, err := kubeletplugin.Start(klog.NewContext(context.WithoutCancel(ctx), logger), p,
		kubeletplugin.DriverName(GPUDriver),
		kubeletplugin.NodeName(node.Name),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(node.PluginsRegistryDir()),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return nil, fmt.Errorf("start DRA plugin on %s: %w", node.Name, err)
	}
	p.helper = helper
	return p, nil
}

// Registered reports whether the kubelet has accepted the plugin's registration.
func (p *DRAPlugin) Registered() bool {
	status := p.helper.RegistrationStatus()
	return status != nil && status.PluginRegistered
}

// Stop unregisters the plugin and stops its gRPC servers.
func (p *DRAPlugin) Stop() { p.helper.Stop() }

// Prepared returns the claims (namespace/name) currently prepared on the node.
func (p *DRAPlugin) Prepared() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.prepared))
	for _, name := range p.prepared {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Unprepared returns every claim (namespace/name) the kubelet has unprepared, in order.
func (p *DRAPlugin) Unprepared() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.unprepared)
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *DRAPlugin) PrepareResourceClaims(_ context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		var result kubeletplugin.PrepareResult
		if claim.Status.Allocation == nil {
			result.Err = fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
			out[claim.UID] = result
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != GPUDriver {
				continue
			}
			result.Devices = append(result.Devices, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			})
		}
		p.prepared[claim.UID] = claim.Namespace + "/" + claim.Name
		out[claim.UID] = result
	}
	return out, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *DRAPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		delete(p.prepared, claim.UID)
		p.unprepared = append(p.unprepared, claim.Namespace+"/"+claim.Name)
		out[claim.UID] = nil
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin: background errors are logged.
func (p *DRAPlugin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin; the health service is off.
func (p *DRAPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
