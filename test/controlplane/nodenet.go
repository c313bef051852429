package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The node network: every real kubelet of a cluster lives in one network namespace that the
// harness creates (held by the nodenet process), with its own address from NodeNetworkCIDR on
// that namespace's loopback device. Nothing of a node binds to or dials the machine's own
// interfaces:
//   - kubelet → kube-apiserver goes to 127.0.0.1:<apiserver port> inside the namespace, which
//     nodenet forwards to the machine's 127.0.0.1:<apiserver port>;
//   - kube-apiserver → kubelet (logs, exec) goes through the apiserver's egress selector, as HTTP
//     CONNECT over a unix socket that nodenet serves and dials inside the namespace.
// See docs/controlplane.md ("Real nodes") for why this design and not a namespace per cluster.

// NodeNetworkCIDR is the documentation range (TEST-NET-2) node addresses come from.
const NodeNetworkCIDR = "198.51.100.0/24"

// KubernetesServiceAddress is the `kubernetes` Service's ClusterIP (the first address of
// --service-cluster-ip-range) and port. nodenet serves it inside the node network, forwarded to
// kube-apiserver, so pods on nodes with real containers use the in-cluster configuration as is.
const KubernetesServiceAddress = "10.96.0.1:443"

const compNodeNet = "nodenet"

// nodeNetworkTools are the util-linux and iproute2 commands the node network needs;
// hack/controlplane/deps.sh installs them.
var nodeNetworkTools = []string{"ip", "nsenter", "unshare", "mount", "sh"}

func checkNodeNetworkTools() error {
	var missing []string
	for _, tool := range nodeNetworkTools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("real nodes need %s on PATH (hack/controlplane/deps.sh installs them)", strings.Join(missing, ", "))
	}
	if os.Geteuid() != 0 {
		return errors.New("real nodes need root (network and mount namespaces, mounts for the kubelet)")
	}
	return nil
}

// egressSocket is the unix socket kube-apiserver sends its cluster egress to.
func (c *Cluster) egressSocket() string { return c.path("egress.sock") }

// nodeNetworkAPIServerFlags writes the egress selector configuration and a kubelet client
// certificate and returns the kube-apiserver flags that use them.
func (c *Cluster) nodeNetworkAPIServerFlags() ([]string, error) {
	egress := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %q
`, c.egressSocket())
	egressPath := c.path("egress-selector.yaml")
	if err := os.WriteFile(egressPath, []byte(egress), 0o600); err != nil {
		return nil, fmt.Errorf("write egress selector configuration: %w", err)
	}
	certPEM, keyPEM, err := c.ca.issue("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	certPath, keyPath := c.path("pki", "apiserver-kubelet-client.crt"), c.path("pki", "apiserver-kubelet-client.key")
	if err := os.WriteFile(certPath, certPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write kubelet client certificate: %w", err)
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write kubelet client key: %w", err)
	}
	return []string{
		"--egress-selector-config-file=" + egressPath,
		"--kubelet-client-certificate=" + certPath,
		"--kubelet-client-key=" + keyPath,
		// Kubelet serving certificates are signed by the harness's CA.
		"--kubelet-certificate-authority=" + c.path("pki", "client-ca.crt"),
		// Node names do not resolve; the egress proxy dials addresses.
		"--kubelet-preferred-address-types=InternalIP",
	}, nil
}

// startNodeNetwork starts nodenet in a new network namespace, after kube-apiserver (whose port it
// forwards), and waits until it serves both crossings.
func (c *Cluster) startNodeNetwork(ctx context.Context) error {
	hostNS, err := os.Open("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("open this process's network namespace: %w", err)
	}
	defer func() { _ = hostNS.Close() }()
	port := c.apiServerPort()
	apiserver := "127.0.0.1:" + strconv.Itoa(port)
	p, err := startProcessWith(compNodeNet, c.bin(BinNodeNet), []string{
		"--apiserver=" + apiserver,
		"--egress-socket=" + c.egressSocket(),
		"--node-cidr=" + NodeNetworkCIDR,
		"--service-address=" + KubernetesServiceAddress,
	}, c.path("logs", compNodeNet+".log"), c.opts.Detach, func(cmd *exec.Cmd) {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNET
		cmd.ExtraFiles = []*os.File{hostNS} // fd 3
	})
	if err != nil {
		return err
	}
	p.ports = []int{port}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.nodeNet = p
	c.mu.Unlock()
	ready := func(context.Context) error {
		if _, err := os.Stat(c.egressSocket()); err != nil {
			return fmt.Errorf("egress socket not there yet: %w", err)
		}
		return nil
	}
	if err := waitReady(ctx, p, ready); err != nil {
		return err
	}
	c.progress("node network ready (namespace of pid %d, nodes in %s)", p.pid(), NodeNetworkCIDR)
	return nil
}

// apiServerPort is the port kube-apiserver listens on (c.host is https://127.0.0.1:PORT).
func (c *Cluster) apiServerPort() int {
	port, _ := strconv.Atoi(c.host[strings.LastIndexByte(c.host, ':')+1:])
	return port
}

// nextNodeIP hands out node addresses 198.51.100.1, .2, ... in start order.
func (c *Cluster) nextNodeIP() (netip.Addr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	prefix := netip.MustParsePrefix(NodeNetworkCIDR)
	ip := prefix.Addr()
	for range c.nodeIPs + 1 {
		ip = ip.Next()
	}
	if !prefix.Contains(ip) || ip == netip.MustParseAddr("198.51.100.255") {
		return netip.Addr{}, fmt.Errorf("no node address left in %s", NodeNetworkCIDR)
	}
	c.nodeIPs++
	return ip, nil
}

// inNodeNetwork returns the command line that runs argv inside the node network namespace.
func (c *Cluster) inNodeNetwork(argv ...string) ([]string, error) {
	c.mu.Lock()
	holder := c.nodeNet
	c.mu.Unlock()
	if holder == nil {
		return nil, errors.New("the cluster has no node network: start it with Options.KubeletNodes or Options.NodeNetwork")
	}
	if err := exitedEarly(holder); err != nil {
		return nil, fmt.Errorf("the node network is gone: %w\n%s", err, holder.tail(20))
	}
	return append([]string{"nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", holder.pid()), "--"}, argv...), nil
}

// addNodeAddress puts ip on the node network's loopback device.
func (c *Cluster) addNodeAddress(ctx context.Context, ip netip.Addr) error {
	argv, err := c.inNodeNetwork("ip", "addr", "replace", ip.String()+"/32", "dev", "lo")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("add node address %s: %w: %s", ip, err, out)
	}
	return nil
}
