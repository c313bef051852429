package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubeletNodeName is the name of the i-th node that Options.KubeletNodes starts.
func KubeletNodeName(i int) string { return fmt.Sprintf("gpuhealth-node-%d", i) }

// kubeletPort is every kubelet's port; each node has an address of its own, so they never clash.
const kubeletPort = 10250

// KubeletNodeOptions configure StartKubeletNode.
type KubeletNodeOptions struct {
	// Labels are passed as --node-labels (NodeRestriction limits which a kubelet may set).
	Labels map[string]string
}

// KubeletNode is one real kubelet v1.37.2 with its fake CRI runtime, or with containerd, runc and
// CNI when the cluster has Options.Containers (containerd.go). Its directory holds what
// other processes on "the node" use: the device-plugin directory, the DRA plugin directories and
// the pod-resources socket.
type KubeletNode struct {
	// Name is the Node's name and the kubelet's identity (system:node:<Name>).
	Name string
	// IP is the node's InternalIP, on the node network's loopback device.
	IP netip.Addr
	// Dir is the kubelet's --root-dir, also holding its kubeconfig, config, PKI and pod logs.
	Dir string

	cluster     *Cluster
	kubeletArgs []string // the kubelet's own flags, for restarts
	kubelet     *process
	cri         *process // the fake CRI, or nil
	containerd  *process // containerd, or nil
}

// DevicePluginDir is where device plugins register: the kubelet sees it as
// /var/lib/kubelet/device-plugins (hard-coded in the kubelet), through a bind mount in its own
// mount namespace. It holds the kubelet's kubelet.sock.
func (n *KubeletNode) DevicePluginDir() string { return filepath.Join(n.Dir, "device-plugins") }

// PluginsRegistryDir is where DRA (and CSI) plugins put their registration sockets.
func (n *KubeletNode) PluginsRegistryDir() string { return filepath.Join(n.Dir, "plugins_registry") }

// PluginsDir is the parent of each DRA plugin's own socket directory (plugins/<driver>/).
func (n *KubeletNode) PluginsDir() string { return filepath.Join(n.Dir, "plugins") }

// PodResourcesDir holds the kubelet's pod-resources socket, kubelet.sock.
func (n *KubeletNode) PodResourcesDir() string { return filepath.Join(n.Dir, "pod-resources") }

// PodResourcesSocket is the kubelet's pod-resources API socket.
func (n *KubeletNode) PodResourcesSocket() string {
	return filepath.Join(n.PodResourcesDir(), "kubelet.sock")
}

// Kubeconfig is the kubelet's kubeconfig (identity system:node:<Name>).
func (n *KubeletNode) Kubeconfig() string { return filepath.Join(n.Dir, "kubeconfig") }

// KubeletLog is the kubelet's log file.
func (n *KubeletNode) KubeletLog() string { return n.kubelet.logPath }

// KubeletNode returns the running real node called name, or nil.
func (c *Cluster) KubeletNode(name string) *KubeletNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[name]
}

// KubeletNodes returns the real nodes in start order.
func (c *Cluster) KubeletNodes() []*KubeletNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Collect(maps.Values(c.nodes))
	slices.SortFunc(out, func(a, b *KubeletNode) int { return a.IP.Compare(b.IP) })
	return out
}

// forbiddenNodeDirs are hidden by tmpfs mounts in each kubelet's mount namespace, so a node
// directory must not live under them.
var forbiddenNodeDirs = []string{"/var/lib", "/var/log", "/run"}

// nodeMountScript runs inside the kubelet's private mount namespace (unshare --mount
// --propagation private), then execs the kubelet. The tmpfs mounts keep every path the kubelet
// hard-codes (the device-plugin directory, /var/log/containers, /run) off the machine, and they
// vanish with the namespace when the kubelet exits, also when it is killed.
const nodeMountScript = `set -eu
node_dir=$1
shift
for d in /var/lib /var/log /run; do
	mount -t tmpfs -o mode=0755,size=64m gpuhealth-node "$d"
done
mkdir -p /var/lib/kubelet/device-plugins /var/log/containers /var/log/pods
# The kubelet makes its root directory a shared mount point when it is not one, in a goroutine
# that races the sockets it creates there: a socket renamed across that new mount fails
# ("invalid cross-device link"; the kubelet exited so once in CI). So it is one before it starts.
mount --bind "$node_dir" "$node_dir"
mount --make-rshared "$node_dir"
mount --bind "$node_dir/device-plugins" /var/lib/kubelet/device-plugins
# An empty working directory: the kubelet's container-log cleanup works relative to it.
cd "$node_dir/cwd"
exec "$@"
`

// StartKubeletNode starts a real kubelet (and a fake CRI runtime for it) as node name, and
// returns once the Node is Ready and schedulable (the node-lifecycle controller has removed the
// not-ready taint). The cluster must have a node network (Options.KubeletNodes or
// Options.NodeNetwork). On error nothing of the node keeps running, and the error carries the
// kubelet's log tail.
func (c *Cluster) StartKubeletNode(ctx context.Context, name string, opts KubeletNodeOptions) (_ *KubeletNode, err error) {
	if c.KubeletNode(name) != nil {
		return nil, fmt.Errorf("node %s already runs", name)
	}
	ip, err := c.nextNodeIP()
	if err != nil {
		return nil, err
	}
	nodesDir := c.opts.NodesDir
	if nodesDir == "" {
		nodesDir = c.path("nodes")
	}
	if nodesDir, err = filepath.Abs(nodesDir); err != nil {
		return nil, fmt.Errorf("nodes directory: %w", err)
	}
	n := &KubeletNode{Name: name, IP: ip, Dir: filepath.Join(nodesDir, name), cluster: c}
	for _, forbidden := range forbiddenNodeDirs {
		if n.Dir == forbidden || strings.HasPrefix(n.Dir, forbidden+"/") {
			return nil, fmt.Errorf("node directory %s is under %s, which the kubelet's mount namespace hides", n.Dir, forbidden)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	defer func() {
		if err != nil {
			_ = n.stopProcesses()
			c.forget(n.kubelet)
			c.forget(n.cri)
			c.forget(n.containerd)
		}
	}()
	if err := c.addNodeAddress(ctx, ip); err != nil {
		return nil, err
	}
	if err := n.writeFiles(opts); err != nil {
		return nil, err
	}
	if c.containerdBin != "" {
		if err := n.startContainerd(ctx); err != nil {
			return nil, err
		}
	} else if err := n.startCRI(ctx); err != nil {
		return nil, err
	}
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.nodes == nil {
		c.nodes = map[string]*KubeletNode{}
	}
	c.nodes[name] = n
	c.mu.Unlock()
	c.progress("kubelet node %s ready at %s (%s)", name, ip, n.Dir)
	return n, nil
}

// writeFiles lays out the node directory: kubeconfig, serving certificate, kubelet config.
func (n *KubeletNode) writeFiles(opts KubeletNodeOptions) error {
	c := n.cluster
	for _, sub := range []string{"", "pki", "cwd", "device-plugins", "plugins_registry", "plugins", "pod-resources", "pod-logs", "image-fs"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, sub), 0o755); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	cfg, err := c.NodeConfig(n.Name)
	if err != nil {
		return err
	}
	if err := c.WriteKubeconfig(n.Kubeconfig(), cfg); err != nil {
		return err
	}
	certPEM, keyPEM, err := c.ca.issueServingFor("kubelet "+n.Name, []net.IP{n.IP.AsSlice()}, []string{n.Name})
	if err != nil {
		return err
	}
	certPath, keyPath := filepath.Join(n.Dir, "pki", "kubelet.crt"), filepath.Join(n.Dir, "pki", "kubelet.key")
	if err := os.WriteFile(certPath, certPEM, 0o600); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	configPath := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(configPath, []byte(n.kubeletConfig(certPath, keyPath)), 0o600); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	kubeletArgs := []string{
		"--config=" + configPath,
		"--kubeconfig=" + n.Kubeconfig(),
		"--root-dir=" + n.Dir,
		"--cert-dir=" + filepath.Join(n.Dir, "pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP.String(),
		"--v=2",
	}
	if len(opts.Labels) > 0 {
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(opts.Labels)) {
			labels = append(labels, k+"="+opts.Labels[k])
		}
		kubeletArgs = append(kubeletArgs, "--node-labels="+strings.Join(labels, ","))
	}
	n.kubeletArgs = kubeletArgs
	return nil
}

// kubeletCommand is the kubelet's full command line. nsenter (node network) → unshare (own mount
// namespace) → sh (mounts) → kubelet: each execs the next, so the PID we hold is the kubelet's
// and Pdeathsig reaches it. With containerd, the kubelet joins containerd's mount namespace
// instead (containerd set up the mounts), so both see the same volumes and hostPaths.
func (n *KubeletNode) kubeletCommand() ([]string, error) {
	c := n.cluster
	if n.containerd != nil {
		return c.inNodeNetwork(append([]string{"nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", n.containerd.pid()), "--",
			"sh", "-c", `cd "$1/cwd" && shift && exec "$@"`, "gpuhealth-node", n.Dir, c.bin(BinKubelet)}, n.kubeletArgs...)...)
	}
	return c.inNodeNetwork(append([]string{"unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", nodeMountScript, "gpuhealth-node", n.Dir, c.bin(BinKubelet)}, n.kubeletArgs...)...)
}

// kubeletConfig is the KubeletConfiguration; docs/controlplane.md explains each setting.
func (n *KubeletNode) kubeletConfig(certPath, keyPath string) string {
	c := n.cluster
	var gates strings.Builder
	for _, kv := range strings.Split(c.opts.FeatureGates, ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok {
			fmt.Fprintf(&gates, "\n  %s: %s", k, v)
		}
	}
	featureGates := "{}"
	if gates.Len() > 0 {
		featureGates = gates.String()
	}
	endpoint := "unix://" + n.CRISocket()
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: %[2]d
healthzBindAddress: %[1]s
healthzPort: 10248
readOnlyPort: 0
tlsCertFile: %[3]q
tlsPrivateKeyFile: %[4]q
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[5]q
authorization:
  mode: Webhook
containerRuntimeEndpoint: %[6]q
imageServiceEndpoint: %[6]q
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
podLogsDir: %[7]q
resolvConf: ""
evictionHard:
  memory.available: "1Mi"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
featureGates: %[8]s
`, n.IP, kubeletPort, certPath, keyPath, c.path("pki", "client-ca.crt"), endpoint,
		filepath.Join(n.Dir, "pod-logs"), featureGates)
}

func (n *KubeletNode) startCRI(ctx context.Context) error {
	c := n.cluster
	socket := n.CRISocket()
	_ = os.Remove(socket)
	p, err := startProcess("fakecri-"+n.Name, c.bin(BinFakeCRI), []string{
		"--endpoint=unix://" + socket,
		"--image-fs-dir=" + filepath.Join(n.Dir, "image-fs"),
	}, c.path("logs", "fakecri-"+n.Name+".log"), c.opts.Detach)
	if err != nil {
		return err
	}
	n.cri = p
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return waitReady(ctx, p, func(context.Context) error {
		if _, err := os.Stat(socket); err != nil {
			return fmt.Errorf("CRI socket not there yet: %w", err)
		}
		return nil
	})
}

func (n *KubeletNode) startKubelet(ctx context.Context) error {
	c := n.cluster
	argv, err := n.kubeletCommand()
	if err != nil {
		return err
	}
	p, err := startProcessWith("kubelet-"+n.Name, argv[0], argv[1:], c.path("logs", "kubelet-"+n.Name+".log"), c.opts.Detach, nil)
	if err != nil {
		return err
	}
	p.binary = c.bin(BinKubelet)
	p.ports = []int{kubeletPort}
	n.kubelet = p
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return waitReady(ctx, p, n.schedulable)
}

// schedulable succeeds once the Node is Ready and carries no not-ready or unreachable taint.
func (n *KubeletNode) schedulable(ctx context.Context) error {
	node, err := n.cluster.adminClient.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("node %s not registered yet", n.Name)
	}
	if err != nil {
		return err
	}
	ready := slices.ContainsFunc(node.Status.Conditions, func(cond corev1.NodeCondition) bool {
		return cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue
	})
	if !ready {
		return fmt.Errorf("node %s not Ready yet", n.Name)
	}
	for _, t := range node.Spec.Taints {
		if t.Key == TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
			return fmt.Errorf("node %s still has taint %s", n.Name, t.Key)
		}
	}
	return nil
}

// RestartKubelet stops the node's kubelet (SIGTERM, as systemd would) and starts it again with the
// same configuration, returning once the node is Ready again. The CRI runtime keeps running, as
// containerd does across kubelet restarts.
func (c *Cluster) RestartKubelet(ctx context.Context, name string) error {
	n := c.KubeletNode(name)
	if n == nil {
		return fmt.Errorf("no real node %s", name)
	}
	if err := n.kubelet.stop(30 * time.Second); err != nil {
		return fmt.Errorf("stop kubelet %s: %w", name, err)
	}
	c.forget(n.kubelet)
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	if err := n.startKubelet(ctx); err != nil {
		return fmt.Errorf("restart kubelet %s: %w", name, err)
	}
	return nil
}

// stopProcesses stops the kubelet, then its runtime (for containerd with everything it runs).
// Their mount namespace goes with the last of them.
func (n *KubeletNode) stopProcesses() error {
	if n.containerd != nil {
		return n.stopContainers()
	}
	var errs []error
	for _, p := range []*process{n.kubelet, n.cri} {
		if p != nil {
			errs = append(errs, p.stop(10*time.Second))
		}
	}
	return errors.Join(errs...)
}

// startKubeletNodes starts Options.KubeletNodes nodes, one after another (the kubelets' start-up
// is CPU-bound on two cores).
func (c *Cluster) startKubeletNodes(ctx context.Context) error {
	var errs []error
	for i := range c.opts.KubeletNodes {
		if _, err := c.StartKubeletNode(ctx, KubeletNodeName(i), KubeletNodeOptions{}); err != nil {
			errs = append(errs, err)
			break
		}
	}
	return errors.Join(errs...)
}
