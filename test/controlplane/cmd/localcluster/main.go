// Command localcluster starts the test control plane in the background for humans and scripts
// (`make cluster-up`, through hack/controlplane/cluster.sh). It starts etcd, kube-apiserver,
// kube-scheduler and kube-controller-manager detached from itself, waits until they are ready,
// writes the admin kubeconfig and the PID list, links kubectl, and exits leaving them running.
// hack/controlplane/cluster.sh down stops them by the recorded PIDs.
//
// With --nodes N (default 1) it also starts N real kubelet nodes, gpuhealth-node-0..N-1, in the
// harness's node network (see test/controlplane/nodenet.go); with --containers they run
// containerd, runc and CNI instead of the fake CRI (test/controlplane/containerd.go). Each node
// publishes --gpus (default 8) simulated GPUs in a ResourceSlice, as a DRA driver would.
//
// Layout under --dir (default .cluster):
//
//	kubeconfig        admin kubeconfig (system:masters)
//	bin/kubectl       link to the cached kubectl
//	pids              "name pid binary" per running component, in start order
//	run/              data, certificates, component kubeconfigs, logs/
//	nodes/NAME/       each real node: kubeconfig (system:node:NAME), device-plugins/ (holds the
//	                  kubelet's kubelet.sock), plugins_registry/ and plugins/ (DRA), pod-resources/
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "localcluster: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("localcluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", ".cluster", "directory for the kubeconfig, PIDs, kubectl link, data and logs")
	binDir := fs.String("bin", "", "directory with the control-plane binaries (default: $"+controlplane.BinDirEnv+" or hack/controlplane/build.sh)")
	featureGates := fs.String("feature-gates", "", "--feature-gates for kube-apiserver, kube-scheduler, kube-controller-manager and the kubelets")
	nodes := fs.Int("nodes", 1, "real kubelet nodes to start, named gpuhealth-node-0..N-1 (0: control plane only)")
	containers := fs.Bool("containers", false, "give the nodes containerd + runc + CNI instead of the fake CRI, so pods really run")
	gpus := fs.Int("gpus", 8, "simulated GPUs each node publishes in a ResourceSlice of driver gpu.nvidia.com, as NVIDIA's DRA driver would, with the UUIDs the sim backend gives them: the devices the agents' DeviceTaintRules select (0: none)")
	containerdBin := fs.String("containerd-bin", "", "directory with containerd, its shim, ctr, crihelper and the pause image (default: $"+controlplane.ContainerdBinDirEnv+" or hack/controlplane/containerd.sh)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: localcluster up [flags]")
		fs.PrintDefaults()
	}
	if len(args) == 0 || args[0] != "up" {
		fs.Usage()
		return errors.New("the only command is up (cluster.sh down stops the cluster)")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	root, err := filepath.Abs(*dir)
	if err != nil {
		return fmt.Errorf("cluster directory: %w", err)
	}
	pidsPath := filepath.Join(root, "pids")
	kubeconfig := filepath.Join(root, "kubeconfig")
	kubectl := filepath.Join(root, "bin", "kubectl")

	if running, err := anyRunning(pidsPath); err != nil {
		return err
	} else if running {
		fmt.Fprintf(stdout, "cluster already running (PIDs in %s)\nexport KUBECONFIG=%s\n", pidsPath, kubeconfig)
		return nil
	}

	if *nodes < 0 {
		return fmt.Errorf("--nodes %d: want 0 or more", *nodes)
	}
	if *gpus < 0 {
		return fmt.Errorf("--gpus %d: want 0 or more", *gpus)
	}
	// A fresh cluster every time: old etcd data would leak objects into the new one, and old
	// kubelet state would confuse the new nodes.
	runDir := filepath.Join(root, "run")
	nodesDir := filepath.Join(root, "nodes")
	for _, dir := range []string{runDir, nodesDir} {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove old cluster data: %w", err)
		}
	}
	started := time.Now()
	c, err := controlplane.Start(ctx, controlplane.Options{
		BinDir:           *binDir,
		Dir:              runDir,
		KeepDir:          true,
		FeatureGates:     *featureGates,
		KubeletNodes:     *nodes,
		Containers:       *containers,
		ContainerdBinDir: *containerdBin,
		NodesDir:         nodesDir,
		Detach:           true,
		StartTimeout:     3 * time.Minute,
		Progress:         func(msg string) { fmt.Fprintf(stderr, "[cluster-up] %s\n", msg) },
	})
	if err != nil {
		return err
	}
	if err := finish(c, pidsPath, kubeconfig, kubectl); err != nil {
		_ = c.Stop()
		return err
	}
	// After the kubelets started: a starting kubelet deletes its node's slices of DRA drivers
	// that have not registered with it.
	if err := publishGPUs(ctx, c, *gpus); err != nil {
		_ = c.Stop()
		return err
	}
	fmt.Fprintf(stdout, `cluster up in %s: %s (Kubernetes %s)
  export KUBECONFIG=%s
  %s get nodes -o wide
`, time.Since(started).Round(100*time.Millisecond), c.Host(), controlplane.KubernetesVersion, kubeconfig, kubectl)
	for _, n := range c.KubeletNodes() {
		fmt.Fprintf(stdout, "node %s (%s): device plugins register in %s\n", n.Name, n.IP, n.DevicePluginDir())
		if *containers {
			fmt.Fprintf(stdout, "  containerd: %s (pods in %s); load images with make image-load\n", filepath.Join(n.Dir, "cri.sock"), n.PodCIDR())
		}
	}
	fmt.Fprintf(stdout, "logs: %s\nstop: make cluster-down\n", filepath.Join(runDir, "logs"))
	return nil
}

// publishGPUs publishes, for every node, a ResourceSlice of gpus simulated GPUs named by the
// UUIDs the sim backend gives that node's GPUs, so that an agent replaying a scenario there (the
// chart's agent.sim.scenario) finds the DRA devices to taint.
func publishGPUs(ctx context.Context, c *controlplane.Cluster, gpus int) error {
	if gpus == 0 {
		return nil
	}
	for _, n := range c.KubeletNodes() {
		uuids := make([]string, gpus)
		for i := range uuids {
			uuids[i] = sim.GPUUUID(n.Name, i)
		}
		if _, err := c.Admin().ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(n.Name, uuids...), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("publish the GPUs of %s: %w", n.Name, err)
		}
	}
	return nil
}

// finish records what cluster.sh down needs and what users need, in that order: PIDs first, so a
// failure after this point can still be cleaned up.
func finish(c *controlplane.Cluster, pidsPath, kubeconfig, kubectl string) error {
	var b strings.Builder
	for _, p := range c.Processes() {
		// /proc/PID/exe shows the resolved path; record that so the checks compare like with like.
		bin, err := filepath.EvalSymlinks(p.Binary)
		if err != nil {
			return fmt.Errorf("resolve %s: %w", p.Binary, err)
		}
		fmt.Fprintf(&b, "%s %d %s\n", p.Name, p.PID, bin)
	}
	if err := writeFileAtomic(pidsPath, []byte(b.String())); err != nil {
		return err
	}
	if err := c.WriteKubeconfig(kubeconfig, c.AdminConfig()); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(kubectl), 0o755); err != nil {
		return fmt.Errorf("link kubectl: %w", err)
	}
	if err := os.Remove(kubectl); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("link kubectl: %w", err)
	}
	if err := os.Symlink(filepath.Join(c.BinDir(), controlplane.BinKubectl), kubectl); err != nil {
		return fmt.Errorf("link kubectl: %w", err)
	}
	return nil
}

// anyRunning reports whether a process recorded in the PID file still runs the recorded binary
// (a PID alone may have been reused by something else since).
func anyRunning(pidsPath string) (bool, error) {
	data, err := os.ReadFile(pidsPath)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", pidsPath, err)
	}
	for line := range strings.Lines(string(data)) {
		fields := strings.Fields(line)
		if len(fields) != 3 {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", fields[1], "exe"))
		if err == nil && strings.TrimSuffix(exe, " (deleted)") == fields[2] {
			return true, nil
		}
	}
	return false, nil
}

func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
