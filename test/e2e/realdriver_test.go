//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// NVIDIA's real user-space driver libraries (Debian's packages of four driver branches, fetched
// by hack/nvidia-drivers.sh) loaded by the image's own root filesystem, as the chart runs it in
// each of its modes. There is no GPU and no NVIDIA kernel module here, so the furthest a real
// library goes is nvmlInit answering ERROR_DRIVER_NOT_LOADED: reaching that answer proves that
// the image found the library, that the dynamic loader resolved every one of its dependencies
// from the image's glibc, and that go-nvml's cgo path called into it.

const (
	driversEnv = "GPUHEALTH_NVIDIA_DRIVERS"
	rootfsEnv  = "GPUHEALTH_IMAGE_ROOTFS"
)

type realDriver struct{ version, dir string }

func realDriverLibraries(t *testing.T) []realDriver {
	t.Helper()
	dir := os.Getenv(driversEnv)
	if dir == "" {
		t.Skipf("$%s is not set (make e2e sets it from hack/nvidia-drivers.sh)", driversEnv)
	}
	data, err := os.ReadFile(filepath.Join(dir, "versions"))
	if err != nil {
		t.Fatal(err)
	}
	var out []realDriver
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		_, v, _ := strings.Cut(line, " ")
		out = append(out, realDriver{version: v, dir: filepath.Join(dir, v)})
	}
	if len(out) != 4 {
		t.Fatalf("%s lists %d drivers, want 4", dir, len(out))
	}
	return out
}

func stagedRootfs(t *testing.T) string {
	t.Helper()
	rootfs := os.Getenv(rootfsEnv)
	if rootfs == "" {
		t.Skipf("$%s is not set (make e2e stages the image's root filesystem and sets it)", rootfsEnv)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "gpuhealth")); err != nil {
		t.Fatalf("$%s: %v", rootfsEnv, err)
	}
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	return rootfs
}

// Every library a real libnvidia-ml.so.1 NEEDs is in the image's root filesystem, for every
// architecture staged (the NEEDED names are glibc's, the same on amd64 and arm64).
func TestDriverLibrariesNeedOnlyTheImagesGlibc(t *testing.T) {
	drivers := realDriverLibraries(t)
	rootfs := os.Getenv(rootfsEnv)
	if rootfs == "" {
		t.Skipf("$%s is not set", rootfsEnv)
	}
	roots := map[string]string{"x86_64-linux-gnu": rootfs}
	if arm := filepath.Join(filepath.Dir(rootfs), "rootfs-arm64"); fileExists(filepath.Join(arm, "gpuhealth")) {
		roots["aarch64-linux-gnu"] = arm
	}
	for _, d := range drivers {
		f, err := elf.Open(filepath.Join(d.dir, "libnvidia-ml.so."+d.version))
		if err != nil {
			t.Fatal(err)
		}
		needed, err := f.ImportedLibraries()
		f.Close()
		if err != nil || len(needed) == 0 {
			t.Fatalf("%s: NEEDED %v, %v", d.version, needed, err)
		}
		for triplet, root := range roots {
			for _, lib := range needed {
				if !fileExists(filepath.Join(root, "lib", triplet, lib)) {
					t.Errorf("driver %s needs %s, which the image's root filesystem %s lacks (hack/image-rootfs.sh: driver_needs)", d.version, lib, root)
				}
			}
		}
		t.Logf("driver %s NEEDs %v: all in the image", d.version, needed)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// A chart mode as rendered: the agent container's command, arguments, environment and the
// driver-root mount, plus the healthconfig file its ConfigMap holds.
type chartAgent struct {
	command      []string
	env          []string
	driverMount  string // mountPath of the driver-root volume ("" in mode runtimeClass)
	hostPath     string // that volume's hostPath
	healthConfig string
}

func renderAgent(t *testing.T, set ...string) chartAgent {
	t.Helper()
	manifest := renderChart(t, helm.Options{Set: set})
	var ra chartAgent
	var ds *appsv1.DaemonSet
	for _, doc := range strings.Split(manifest, "\n---\n") {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			if err := yaml.Unmarshal([]byte(doc), ds); err != nil {
				t.Fatal(err)
			}
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
				t.Fatal(err)
			}
			if c, ok := cm.Data["healthconfig.yaml"]; ok {
				ra.healthConfig = c
			}
		}
	}
	if ds == nil || ra.healthConfig == "" {
		t.Fatal("the chart rendered no agent DaemonSet or no healthconfig.yaml")
	}
	c := ds.Spec.Template.Spec.Containers[0]
	ra.command = append(append([]string{}, c.Command...), c.Args...)
	for _, e := range c.Env {
		switch {
		case e.Value != "":
			ra.env = append(ra.env, e.Name+"="+e.Value)
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			ra.env = append(ra.env, e.Name+"=e2e-"+strings.ReplaceAll(e.ValueFrom.FieldRef.FieldPath, ".", "-"))
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil:
			ra.env = append(ra.env, e.Name+"="+strconv.FormatInt(c.Resources.Limits.Memory().Value(), 10)) // bytes, as the kubelet resolves it
		}
	}
	for _, m := range c.VolumeMounts {
		if m.Name != "driver-root" {
			continue
		}
		ra.driverMount = m.MountPath
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				ra.hostPath = v.HostPath.Path
			}
		}
	}
	return ra
}

// nvmlArgs are the rendered arguments that say where NVML is, for probe.
func (ra chartAgent) nvmlArgs() []string {
	var out []string
	for _, a := range ra.command {
		if strings.HasPrefix(a, "--driver-root") || strings.HasPrefix(a, "--nvml-library-paths") {
			out = append(out, a)
		}
	}
	return out
}

// copyRootfs makes a copy of the staged root filesystem to add a layout to: hard links where the
// filesystem allows, beside the original.
func copyRootfs(t *testing.T, rootfs string) string {
	t.Helper()
	dir, err := os.MkdirTemp(filepath.Dir(rootfs), "driver-layout-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	root := filepath.Join(dir, "root")
	if out, err := exec.Command("cp", "-al", rootfs, root).CombinedOutput(); err != nil {
		if out, err := exec.Command("cp", "-a", rootfs, root).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v\n%s", err, out)
		}
		_ = out
	}
	return root
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// installDriver puts driver d into dir (a driver root, or the container's own root as the NVIDIA
// container toolkit does) in one of the layouts users have.
func installDriver(t *testing.T, dir string, d realDriver, layout string) {
	t.Helper()
	lib := "libnvidia-ml.so." + d.version
	switch layout {
	case "toolkit", "operator-multiarch":
		libdir := filepath.Join(dir, "usr/lib/x86_64-linux-gnu")
		run(t, "mkdir", "-p", libdir)
		run(t, "cp", filepath.Join(d.dir, lib), libdir)
		run(t, "ln", "-sf", lib, filepath.Join(libdir, "libnvidia-ml.so.1"))
	case "operator-lib64":
		libdir := filepath.Join(dir, "usr/lib64")
		run(t, "mkdir", "-p", libdir)
		run(t, "cp", filepath.Join(d.dir, lib), libdir)
		run(t, "ln", "-sf", lib, filepath.Join(libdir, "libnvidia-ml.so.1"))
	case "debian-host":
		// Debian's own install: the library in its package directory, reached through
		// /etc/alternatives-style absolute links.
		pkgdir := filepath.Join(dir, "usr/lib/x86_64-linux-gnu/nvidia/current")
		run(t, "mkdir", "-p", pkgdir, filepath.Join(dir, "etc/nvidia/current"))
		run(t, "cp", filepath.Join(d.dir, lib), pkgdir)
		run(t, "ln", "-sf", "/usr/lib/x86_64-linux-gnu/nvidia/current/"+lib, filepath.Join(dir, "etc/nvidia/current/libnvidia-ml.so.1"))
		run(t, "ln", "-sf", "/etc/nvidia/current/libnvidia-ml.so.1", filepath.Join(dir, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
	default:
		t.Fatalf("unknown layout %q", layout)
	}
}

// foreignGlibc puts Debian 13's glibc (2.41, not the image's) into a driver root, as a host or a
// driver container with another glibc has it.
func foreignGlibc(t *testing.T, dir string) {
	t.Helper()
	glibc := filepath.Join(os.Getenv(driversEnv), "glibc")
	run(t, "mkdir", "-p", dir)
	run(t, "cp", "-a", glibc+"/.", dir)
}

// probeIn runs `/gpuhealth probe` chrooted into root with the rendered environment and NVML
// arguments; it returns the exit code and the output.
func probeIn(t *testing.T, root string, ra chartAgent, extra ...string) (int, string) {
	t.Helper()
	args := append(append([]string{root, "/gpuhealth", "probe"}, ra.nvmlArgs()...), extra...)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "chroot", args...)
	cmd.Env = ra.env // the image has no shell and no env: chroot passes this on
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), string(out)
}

func TestImageLoadsRealDriverLibraries(t *testing.T) {
	drivers := realDriverLibraries(t)
	rootfs := stagedRootfs(t)
	modes := []struct {
		name, layout string
		set          []string
		glibc        bool // a foreign glibc in the driver root
	}{
		{"runtimeClass, toolkit-injected", "toolkit", nil, false},
		{"hostMounts, host driver root with Debian 13's glibc", "debian-host", []string{"agent.nvml.mode=hostMounts", "agent.nvml.driverRoot=/"}, true},
		{"hostMounts, GPU operator driver root (usr/lib64)", "operator-lib64", []string{"agent.nvml.mode=hostMounts", "agent.nvml.driverRoot=/run/nvidia/driver"}, true},
		{"hostMounts, GPU operator driver root (usr/lib/x86_64-linux-gnu)", "operator-multiarch", []string{"agent.nvml.mode=hostMounts", "agent.nvml.driverRoot=/run/nvidia/driver"}, true},
	}
	for _, m := range modes {
		ra := renderAgent(t, m.set...)
		for _, a := range ra.command {
			if strings.Contains(a, "LD_LIBRARY_PATH") {
				t.Fatalf("%s: rendered %q", m.name, a)
			}
		}
		for _, e := range ra.env {
			if strings.HasPrefix(e, "LD_LIBRARY_PATH=") {
				t.Fatalf("%s: the chart puts %s on the agent's environment", m.name, e)
			}
		}
		for _, d := range drivers {
			t.Run(m.name+"/"+d.version, func(t *testing.T) {
				root := copyRootfs(t, rootfs)
				target := root
				if ra.driverMount != "" {
					target = filepath.Join(root, ra.driverMount)
				}
				if m.glibc {
					foreignGlibc(t, target)
					// The layout is a real trap: the driver root's glibc on LD_LIBRARY_PATH, as
					// the chart used to put it, cannot even start the binary.
					old := exec.Command("chroot", root, "/gpuhealth", "version")
					old.Env = append(ra.env, "LD_LIBRARY_PATH="+filepath.Join(ra.driverMount, "usr/lib/x86_64-linux-gnu"))
					if out, err := old.CombinedOutput(); err == nil {
						t.Fatalf("with the driver root's glibc on LD_LIBRARY_PATH the binary still runs (%s): the foreign glibc is not foreign", out)
					}
				}
				installDriver(t, target, d, m.layout)
				code, out := probeIn(t, root, ra)
				if code != 1 || !strings.Contains(out, "the NVIDIA kernel driver is not loaded") || !strings.Contains(out, "libnvidia-ml.so."+d.version) {
					t.Fatalf("probe: exit %d, %q; want exit 1 saying the kernel driver is not loaded, with the library", code, out)
				}
				t.Logf("probe: %s", strings.TrimSpace(out))
				runAgentUntilDriverNotLoaded(t, root, ra, "the NVIDIA kernel driver is not loaded")
			})
		}
	}

	// The other two answers, on the image's root filesystem as rendered for hostMounts.
	ra := renderAgent(t, "agent.nvml.mode=hostMounts", "agent.nvml.driverRoot=/run/nvidia/driver")
	t.Run("no library", func(t *testing.T) {
		root := copyRootfs(t, rootfs)
		run(t, "mkdir", "-p", filepath.Join(root, ra.driverMount, "usr/lib64"))
		code, out := probeIn(t, root, ra)
		if code != 1 || !strings.Contains(out, "NVML library not found under driver root /driver-root") || !strings.Contains(out, "/driver-root/usr/lib64/libnvidia-ml.so.1") {
			t.Fatalf("probe: exit %d, %q; want exit 1, library not found, with the paths searched", code, out)
		}
	})
	t.Run("a dependency removed", func(t *testing.T) {
		root := copyRootfs(t, rootfs)
		installDriver(t, filepath.Join(root, ra.driverMount), drivers[len(drivers)-1], "operator-lib64")
		run(t, "rm", filepath.Join(root, "lib/x86_64-linux-gnu/libpthread.so.0"))
		code, out := probeIn(t, root, ra)
		if code != 1 || !strings.Contains(out, "NVML library cannot be loaded") || !strings.Contains(out, "libpthread.so.0") {
			t.Fatalf("probe: exit %d, %q; want exit 1, cannot be loaded, naming libpthread.so.0", code, out)
		}
	})
	t.Run("a library that lacks core functions", func(t *testing.T) {
		// A stub, a partial install: it loads, and go-nvml's first call of a function it lacks
		// would end the process (symbol lookup error, exit 127) with no word of why.
		cc, err := exec.LookPath("cc")
		if err != nil {
			t.Skip("no C compiler:", err)
		}
		root := copyRootfs(t, rootfs)
		lib := filepath.Join(root, ra.driverMount, "usr/lib64/libnvidia-ml.so.1")
		run(t, "mkdir", "-p", filepath.Dir(lib))
		src := filepath.Join(t.TempDir(), "stub.c")
		if err := os.WriteFile(src, []byte("int nvmlInit_v2(void) { return 0; }\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, cc, "-shared", "-fPIC", "-o", lib, src)
		code, out := probeIn(t, root, ra)
		if code != 1 || !strings.Contains(out, "NVML library cannot be loaded") || !strings.Contains(out, "lacks nvmlShutdown") ||
			!strings.Contains(out, "nvmlSystemGetDriverVersion") {
			t.Fatalf("probe: exit %d, %q; want exit 1, cannot be loaded, naming the functions it lacks", code, out)
		}
		// The agent stays up, not ready, and says why, once.
		runAgentUntilDriverNotLoaded(t, root, ra, "lacks nvmlShutdown")
	})
	t.Run("a library for another architecture", func(t *testing.T) {
		root := copyRootfs(t, rootfs)
		lib := filepath.Join(root, ra.driverMount, "usr/lib64/libnvidia-ml.so.1")
		installDriver(t, filepath.Join(root, ra.driverMount), drivers[len(drivers)-1], "operator-lib64")
		data, err := os.ReadFile(lib)
		if err != nil {
			t.Fatal(err)
		}
		data[18], data[19] = 183, 0 // EM_AARCH64
		run(t, "rm", lib)
		if err := os.WriteFile(lib, data, 0o644); err != nil {
			t.Fatal(err)
		}
		code, out := probeIn(t, root, ra)
		if code != 1 || !strings.Contains(out, "NVML library cannot be loaded") || !strings.Contains(out, "built for EM_AARCH64") {
			t.Fatalf("probe: exit %d, %q; want exit 1, cannot be loaded, built for another architecture", code, out)
		}
	})
}

// runAgentUntilDriverNotLoaded runs the agent container's command and environment as rendered,
// chrooted into root and in a network namespace of its own (its metrics address binds every
// interface, and its API server is unreachable there), with the files the kubelet would give it
// (the healthconfig ConfigMap, a service-account token). The agent must not exit: it logs the
// driver-not-loaded answer once and keeps retrying.
func runAgentUntilDriverNotLoaded(t *testing.T, root string, ra chartAgent, says string) {
	t.Helper()
	for path, content := range map[string]string{
		"etc/gpuhealth/healthconfig.yaml":                        ra.healthConfig,
		"var/run/secrets/kubernetes.io/serviceaccount/token":     "e2e-token",
		"var/run/secrets/kubernetes.io/serviceaccount/ca.crt":    "",
		"var/run/secrets/kubernetes.io/serviceaccount/namespace": "gpuhealth-system",
	} {
		p := filepath.Join(root, path)
		run(t, "mkdir", "-p", filepath.Dir(p), filepath.Join(root, "var/lib/gpuhealth"))
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	chroot, err := exec.LookPath("chroot")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"--net", chroot, root}, ra.command...)...)
	cmd.Env = append(ra.env, "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(out.String(), says) {
		select {
		case err := <-exited:
			t.Fatalf("the agent exited (%v) instead of waiting for the driver:\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("the agent did not say %q within 30s:\n%s", says, out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Still up a little later: it retries instead of exiting.
	select {
	case err := <-exited:
		t.Fatalf("the agent exited (%v) after the driver error:\n%s", err, out.String())
	case <-time.After(2 * time.Second):
	}
	cancel()
	if err := <-exited; err == nil {
		t.Errorf("the agent exited cleanly before it was stopped")
	}
	if n := strings.Count(out.String(), says); n != 1 {
		t.Errorf("the agent logged the driver error %d times in 2 s of retries, want once (it logs again only when the reason changes):\n%s", n, out.String())
	}
}

// syncBuffer is a bytes.Buffer that a process's output and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestAgentWaitsForTheDriver: an agent whose driver root holds NVIDIA's real library but no
// kernel driver is loaded (as while the GPU operator's driver container starts, or during a driver
// upgrade) stays up, says why, is not ready, reports gpuhealth_source_up{source="nvml"} 0 and the
// GPUUnhealthy condition Unknown, and keeps every fault an earlier agent reported.
func TestAgentWaitsForTheDriver(t *testing.T) {
	drivers := realDriverLibraries(t)
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "agent-no-driver"
	gpuNode(t, c, node, 4)
	kubeconfig := agentKubeconfig(t, c)
	checkpoint := filepath.Join(t.TempDir(), "ckpt.json")
	first := startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: kubeconfig, checkpoint: checkpoint,
		scenario: "events:\n  - {at: 0s, gpu: 2, xid: 79}\n"})
	eventually(t, "fault reported", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		rs, rerr := rules(ctx, c, node)
		return err == nil && rerr == nil && ann[gpuhealthv1.UnhealthyIDsKey] == "2" && len(rs) == 1, fmt.Sprintf("ids=%q rules=%d", ann[gpuhealthv1.UnhealthyIDsKey], len(rs)), errors.Join(err, rerr)
	})
	first.stop()

	d := drivers[len(drivers)-1]
	root := t.TempDir()
	installDriver(t, root, d, "operator-lib64")
	dir := t.TempDir()
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, []byte(agentConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	metrics := "http://127.0.0.1:" + strconv.Itoa(port)
	p := startProcess(t, "agent", filepath.Join(dir, "agent.log"), gpuhealthBinary(t), "agent", "--backend", "nvml",
		"--driver-root", root, "--node-name", node, "--kubeconfig", kubeconfig, "--config", configPath,
		"--checkpoint", checkpoint, "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port), "-v", "2")

	eventually(t, "condition Unknown, not ready, source down", func(ctx context.Context) (bool, string, error) {
		if exited, log := p.exited(); exited {
			return false, "", fmt.Errorf("the agent exited:\n%s", log)
		}
		cond, err := nodeCondition(ctx, c, node, corev1.NodeConditionType(gpuhealthv1.ConditionGPUUnhealthy))
		if err != nil {
			return false, "", err
		}
		readyz, _ := httpGetStatus(metrics + "/readyz")
		body, _ := httpGet(metrics + "/metrics")
		up := strings.Contains(body, `gpuhealth_source_up{node="`+node+`",source="nvml"} 0`)
		ok := cond.Status == corev1.ConditionUnknown && cond.Reason == gpuhealthv1.ReasonNVMLUnavailable &&
			strings.Contains(cond.Message, "the NVIDIA kernel driver is not loaded") && readyz == http.StatusServiceUnavailable && up
		return ok, fmt.Sprintf("condition %s/%s %q, readyz %d, source_up nvml 0: %v", cond.Status, cond.Reason, cond.Message, readyz, up), nil
	})
	ann, err := nodeAnnotations(t.Context(), c, node)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rules(t.Context(), c, node)
	if err != nil {
		t.Fatal(err)
	}
	if ann[gpuhealthv1.UnhealthyIDsKey] != "2" || len(rs) != 1 {
		t.Errorf("while NVML is away: ids=%q, %d rules; want the earlier fault kept (2, one rule)", ann[gpuhealthv1.UnhealthyIDsKey], len(rs))
	}
}

func httpGetStatus(url string) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
