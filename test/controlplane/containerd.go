package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Real containers: with Options.Containers each real node runs containerd v2 (built from Go
// modules by hack/controlplane/containerd.sh) with runc and the bridge/host-local CNI plugins
// (Debian's, hack/controlplane/deps.sh) instead of the fake CRI. Per node:
//   - containerd runs in a mount namespace of its own (tmpfs over /run, /var/lib, /var/log, as for
//     the kubelet), and the kubelet joins that namespace, so both see the same volume mounts,
//     hostPath directories (such as /var/lib/gpuhealth) and device-plugin directory, and nothing
//     they mount reaches the machine;
//   - its socket is the node directory's cri.sock; its root (images, snapshots) is under the node
//     directory, its state on the namespace's /run;
//   - pods get addresses from the node's own subnet (PodCIDR) on a bridge of its own in the node
//     network, whose gateway address is the way to the `kubernetes` Service that nodenet serves;
//   - the sandbox image is PauseImage, imported from the archive containerd.sh builds.
// Teardown (stopContainers) stops the kubelet, removes every pod through the CRI (containers,
// CNI, mounts, cgroups), stops containerd and kills what is left of the node's shims.

// ContainerdBinDirEnv names the environment variable that points at the directory
// hack/controlplane/containerd.sh prints; unset, FindContainerdBinDir runs that script.
const ContainerdBinDirEnv = "GPUHEALTH_CONTAINERD_BIN"

// PauseImage is the sandbox ("pause") image of nodes with real containers, built here.
const PauseImage = "localhost/gpuhealth/pause:1"

// Files in the containerd bin directory.
const (
	BinContainerd = "containerd"
	BinShim       = "containerd-shim-runc-v2"
	BinCtr        = "ctr"
	// BinCRIHelper removes a node's pods at teardown and normalizes image names for imports.
	BinCRIHelper = "crihelper"
	pauseArchive = "pause.tar"
)

// cniBinDir is where Debian's containernetworking-plugins puts the plugins.
const cniBinDir = "/usr/lib/cni"

// PodNetworkPrefix holds every node's pod subnet: node 198.51.100.K gets 10.244.K.0/24.
const PodNetworkPrefix = "10.244.0.0/16"

// FindContainerdBinDir returns the directory with containerd, its shim, ctr, crihelper and the
// pause image: dir if set, else $GPUHEALTH_CONTAINERD_BIN if set, otherwise what
// hack/controlplane/containerd.sh prints after building or finding them.
func FindContainerdBinDir(ctx context.Context, dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv(ContainerdBinDirEnv)
	}
	if dir == "" {
		var err error
		if dir, err = buildScriptDir(ctx, "containerd.sh", ContainerdBinDirEnv); err != nil {
			return "", err
		}
	}
	for _, f := range []string{BinContainerd, BinShim, BinCtr, BinCRIHelper, pauseArchive} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("containerd bin directory: %w (run hack/controlplane/containerd.sh)", err)
		}
	}
	return filepath.Abs(dir)
}

// CanRunContainers says why this machine can never run nodes with real containers (no root, no
// cgroups), or returns nil. Tests skip on it; what a script installs is CheckContainers' part.
func CanRunContainers() error {
	if os.Geteuid() != 0 {
		return errors.New("real containers need root")
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil {
		if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
			return errors.New("real containers need cgroups: neither cgroup v2 nor a v1 memory hierarchy is mounted at /sys/fs/cgroup")
		}
	}
	return nil
}

// CheckContainers says why nodes with real containers cannot start here, or returns nil: besides
// CanRunContainers they need runc and the CNI plugins (hack/controlplane/deps.sh installs them).
func CheckContainers() error {
	if err := CanRunContainers(); err != nil {
		return err
	}
	var missing []string
	if _, err := exec.LookPath("runc"); err != nil {
		missing = append(missing, "runc")
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(cniBinDir, p))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("real containers need %s (hack/controlplane/deps.sh installs them)", strings.Join(missing, ", "))
	}
	return nil
}

// PodCIDR is the node's pod subnet, 10.244.K.0/24 for node address 198.51.100.K.
func (n *KubeletNode) PodCIDR() netip.Prefix {
	k := n.IP.As4()[3]
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, k, 0}), 24)
}

// bridgeName is the node's CNI bridge in the node network (15 characters at most).
func (n *KubeletNode) bridgeName() string { return fmt.Sprintf("gh-br%d", n.IP.As4()[3]) }

// CRISocket is the node's CRI endpoint: the fake CRI's or containerd's.
func (n *KubeletNode) CRISocket() string { return filepath.Join(n.Dir, "cri.sock") }

// RootFS is the node's file system as its containerd and kubelet see it (their mount namespace,
// through /proc), where hostPath volumes such as /var/lib/gpuhealth live. Empty without
// containerd or once it has stopped.
func (n *KubeletNode) RootFS() string {
	if n.containerd == nil {
		return ""
	}
	if exited, _ := n.containerd.exited(); exited {
		return ""
	}
	return fmt.Sprintf("/proc/%d/root", n.containerd.pid())
}

func (n *KubeletNode) containerdDir() string { return filepath.Join(n.Dir, "containerd") }

// containerdConfig is containerd's configuration (v3, containerd 2.x); docs/controlplane.md
// explains the settings.
func (n *KubeletNode) containerdConfig() string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = "/run/containerd"

[grpc]
  address = %[2]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[3]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[4]q

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[5]q]
    conf_dir = %[6]q
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
`, filepath.Join(n.containerdDir(), "root"), n.CRISocket(), filepath.Join(n.containerdDir(), "opt"),
		PauseImage, cniBinDir, filepath.Join(n.containerdDir(), "cni"))
}

// cniConfig is the node's CNI network: a bridge of its own with the node's subnet. The bridge
// is the pods' gateway into the node network, where the node addresses and the `kubernetes`
// Service address are local: no NAT, no forwarding.
func (n *KubeletNode) cniConfig() string {
	cidr := n.PodCIDR()
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "gpuhealth",
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}]
    }
  }]
}
`, n.bridgeName(), cidr.String())
}

// startContainerd writes containerd's and CNI's configuration, starts containerd in the node
// network and a mount namespace of its own, and imports the pause image.
func (n *KubeletNode) startContainerd(ctx context.Context) error {
	c := n.cluster
	for _, sub := range []string{"root", "opt", "cni"} {
		if err := os.MkdirAll(filepath.Join(n.containerdDir(), sub), 0o755); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	configPath := filepath.Join(n.containerdDir(), "config.toml")
	if err := os.WriteFile(configPath, []byte(n.containerdConfig()), 0o600); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := os.WriteFile(filepath.Join(n.containerdDir(), "cni", "10-gpuhealth.conflist"), []byte(n.cniConfig()), 0o600); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	_ = os.Remove(n.CRISocket())
	bin := filepath.Join(c.containerdBin, BinContainerd)
	argv, err := c.inNodeNetwork("unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", nodeMountScript, "gpuhealth-node", n.Dir, bin, "--config="+configPath)
	if err != nil {
		return err
	}
	p, err := startProcessWith("containerd-"+n.Name, argv[0], argv[1:], c.path("logs", "containerd-"+n.Name+".log"), c.opts.Detach,
		func(cmd *exec.Cmd) {
			// containerd finds its shim on PATH: ours first (an older one in /usr/bin would break
			// every sandbox); runc is in /usr/sbin.
			cmd.Env = append(cmd.Env, "PATH="+c.containerdBin+":"+os.Getenv("PATH")+":/usr/sbin:/sbin")
		})
	if err != nil {
		return err
	}
	p.binary = bin
	n.containerd = p
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	err = waitReady(ctx, p, func(ctx context.Context) error {
		_, err := n.Ctr(ctx, "version")
		return err
	})
	if err != nil {
		return err
	}
	return n.ImportImage(ctx, filepath.Join(c.containerdBin, pauseArchive), "")
}

// Ctr runs ctr against the node's containerd in the CRI's namespace (k8s.io) and returns its
// combined output.
func (n *KubeletNode) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	c := n.cluster
	if c.containerdBin == "" {
		return nil, fmt.Errorf("node %s runs no containerd (Options.Containers)", n.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.containerdBin, BinCtr),
		append([]string{"--address=" + n.CRISocket(), "--namespace=k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s on node %s: %w: %s", strings.Join(args, " "), n.Name, err, bytes.TrimSpace(out))
	}
	return out, nil
}

// ImportImage imports an image archive (OCI or Docker format; for a multi-platform index only
// this machine's platform) into the node's containerd. With name set, the image that the
// archive names name is also tagged with the registry-qualified form the CRI resolves name to,
// so pods that say `image: name` (with imagePullPolicy Never or IfNotPresent) find it.
func (n *KubeletNode) ImportImage(ctx context.Context, archive, name string) error {
	if _, err := n.Ctr(ctx, "images", "import", "--platform=linux/"+runtime.GOARCH, archive); err != nil {
		return err
	}
	if name == "" {
		return nil
	}
	out, err := exec.CommandContext(ctx, filepath.Join(n.cluster.containerdBin, BinCRIHelper), "image-ref", name).Output()
	if err != nil {
		return fmt.Errorf("normalize image name %s: %w", name, err)
	}
	ref := strings.TrimSpace(string(out))
	if ref == name {
		return nil
	}
	_, err = n.Ctr(ctx, "images", "tag", "--force", name, ref)
	return err
}

// stopContainers ends a node with real containers, the kubelet first so it starts nothing new:
// every pod removed through the CRI (containers, CNI, mounts, cgroups), then containerd, then
// any shim of this node still running. The node's mount namespace, and every mount in it, goes
// with its last process; bridges and veths live in the node network, which goes with nodenet.
func (n *KubeletNode) stopContainers() error {
	var errs []error
	if n.kubelet != nil {
		if err := n.kubelet.stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if n.containerd == nil {
		return errors.Join(errs...)
	}
	if exited, _ := n.containerd.exited(); !exited {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		out, err := exec.CommandContext(ctx, filepath.Join(n.cluster.containerdBin, BinCRIHelper),
			"clean", "--endpoint="+n.CRISocket()).CombinedOutput()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: remove pods: %w: %s", n.Name, err, bytes.TrimSpace(out)))
		}
	}
	if err := n.containerd.stop(10 * time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := killShims(n.CRISocket()); err != nil {
		errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
	}
	return errors.Join(errs...)
}

// killShims kills every containerd shim serving a containerd whose socket path starts with
// prefix (one node's socket, or a stale cluster directory), the containers they run first (each
// container's init is a child of its shim, and the rest of the container goes with it), and then
// removes those containers' cgroups. crihelper clean normally leaves nothing for it to do; a test
// binary killed before its teardown leaves shims behind, which the next Start sweeps.
func killShims(prefix string) error {
	deadline := time.Now().Add(10 * time.Second)
	var cgroupIDs []string
	for {
		shims := ShimPIDs(prefix)
		if len(shims) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("shims %v of %s survived SIGKILL", shims, prefix)
		}
		for _, child := range childrenOf(shims) {
			cgroupIDs = append(cgroupIDs, criCgroupIDs(child)...)
			_ = syscall.Kill(child, syscall.SIGKILL)
		}
		for _, pid := range shims {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for _, id := range cgroupIDs {
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/k8s.io", id))
		for _, dir := range dirs {
			// The killed processes leave their cgroups a moment after they exit.
			err := syscall.Rmdir(dir)
			for i := 0; err == syscall.EBUSY && i < 50; i++ {
				time.Sleep(100 * time.Millisecond)
				err = syscall.Rmdir(dir)
			}
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
			}
		}
	}
	// The parent the CRI puts containers under (the containerd namespace's name, k8s.io) goes once
	// empty, which it is not while another node runs pods.
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	for _, dir := range parents {
		_ = syscall.Rmdir(dir)
	}
	return errors.Join(errs...)
}

// ShimPIDs lists the running containerd shims whose containerd's address (their -address
// argument) starts with prefix.
func ShimPIDs(prefix string) []int {
	var pids []int
	for pid, args := range processes() {
		if len(args) == 0 || filepath.Base(args[0]) != BinShim {
			continue
		}
		if i := slices.Index(args, "-address"); i >= 0 && i+1 < len(args) && strings.HasPrefix(args[i+1], prefix) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// processes maps every running process to its command line.
func processes() map[int][]string {
	entries, _ := os.ReadDir("/proc")
	out := map[int][]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		out[pid] = strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	}
	return out
}

// childrenOf lists the processes whose parent is one of parents.
func childrenOf(parents []int) []int {
	var children []int
	for pid := range processes() {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command name (which may hold spaces): state, ppid, ...
		fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		if len(fields) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(fields[1]); err == nil && slices.Contains(parents, ppid) {
			children = append(children, pid)
		}
	}
	return children
}

// criCgroupIDs returns the names of the cgroups under k8s.io (where the CRI puts containers
// when the kubelet gives no parent) that pid belongs to.
func criCgroupIDs(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil
	}
	return parseCRICgroupIDs(string(data))
}

// parseCRICgroupIDs reads /proc/PID/cgroup ("ID:CONTROLLERS:PATH" per hierarchy) for the cgroups
// directly under /k8s.io.
func parseCRICgroupIDs(data string) []string {
	var ids []string
	for line := range strings.Lines(data) {
		_, path, ok := strings.Cut(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ":")
		if rest, found := strings.CutPrefix(path, "/k8s.io/"); ok && found && !strings.Contains(rest, "/") && !slices.Contains(ids, rest) {
			ids = append(ids, rest)
		}
	}
	return ids
}
