//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
	"github.com/gpuhealth/gpuhealth/test/proccred"
)

// The driver lines this test has the kernel log. No NVIDIA driver runs here, and a process that
// writes to /dev/kmsg gets the user facility, which the relay drops; but the kernel logs a
// netfilter LOG rule's prefix at the kernel facility, at the start of the record, as the driver
// logs its lines. The prefix may hold 29 bytes: the oldest XID form, without "PCI:", fits, with
// a code of up to three digits. It names GPU 63 of 64 (simulated GPU i sits at
// 0000:(10+i):00.0): the lines stay in this boot's log, and only a node of 64 simulated GPUs has
// that address, so no other test reads them as about one of its GPUs.
const (
	relayGPUs       = 64
	relayGPU        = 63
	relayKernelLine = "NVRM: Xid (0000:4f:00): %d, "
)

// TestKernelLogRelayOnAContainerdNode installs the chart with its default kernel-log values on a
// containerd node whose NVIDIA driver is the simulator (its library mounted into the agent as the
// NVIDIA runtime would): the kmsg-relay sidecar reads the node's real /dev/kmsg and the
// unprivileged agent gets the driver's lines from it (gpuhealth_source_up{source="kmsg"} 1); a
// line the kernel logs makes its GPU Unhealthy, a line a process writes changes nothing. The
// relay is the only privileged container, runs as nobody with no capability once the log is
// open, and has no ServiceAccount token, which the agent has. Killed, the relay is restarted
// by the kubelet and the agent reads from it again, the agent itself untouched.
func TestKernelLogRelayOnAContainerdNode(t *testing.T) {
	skipWithoutContainers(t)
	if out, err := exec.Command("iptables", "-w", "-S", "OUTPUT").CombinedOutput(); err != nil {
		t.Skipf("skipping: no iptables to have the kernel log a line (%v): %s", err, out)
	}
	t.Parallel()
	libs := simDriverLibraries(t)
	c, n, _ := startContainerdNode(t)
	ctx := t.Context()
	uuids := make([]string, relayGPUs)
	for i := range uuids {
		uuids[i] = simUUID(n.Name, i)
	}
	if _, err := c.Admin().ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(n.Name, uuids...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	root := shortTempDir(t, "sd-relay-")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	startSimDriver(t, libs, root, "", n.Name, relayGPUs, "550")

	// The chart's kernel-log values untouched; the local nodes' image, no NVIDIA runtime, NVML.
	// The reporters this test reads (claimstatus would want the kubelet's pod-resources socket
	// at its default path, which the harness's kubelet keeps elsewhere).
	const ns = "gpuhealth-system"
	manifest := renderChart(t, helm.Options{
		Values: []string{"deployments/helm/gpuhealth/ci/local-values.yaml"},
		Set: []string{"agent.backend=nvml", "agent.nvml.libraryPaths={opt/nvidia-sim}", "config.sampleInterval=5s",
			"config.agent.reporters={annotation,devicetaint,condition}"},
	})
	manifest = withDriverLibrary(t, manifest, filepath.Join(root, "usr/lib/x86_64-linux-gnu"), "/opt/nvidia-sim")
	if _, err := c.Admin().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	applyManifest(t, c, manifest)
	selector := labels.Set{"app.kubernetes.io/instance": "gpuhealth", "app.kubernetes.io/component": "agent"}.String()
	var pod *corev1.Pod
	t.Cleanup(func() {
		if t.Failed() && pod != nil {
			for _, ctr := range []string{"agent", "kmsg-relay"} {
				b, err := c.Admin().CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: ctr}).DoRaw(context.Background())
				t.Logf("logs of %s (%v):\n%s", ctr, err, b)
			}
		}
	})
	eventuallyWithin(t, 2*pollTimeout, "the agent pod Ready", func(ctx context.Context) (bool, string, error) {
		pods, err := c.Admin().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d pods", len(pods.Items)), err
		}
		pod = &pods.Items[0]
		return podReady(pod), fmt.Sprintf("%s ready=%v %+v", pod.Status.Phase, podReady(pod), pod.Status.InitContainerStatuses), nil
	})
	// The agent's metrics, from inside its pod's network namespace (the API server's pod proxy
	// does not reach the pod network here).
	metrics := func(context.Context) (string, error) {
		return getInNetNS(containerPID(t, pod, "agent"), "127.0.0.1:9402", "/metrics")
	}
	sourceUp := func(want int) {
		t.Helper()
		line := fmt.Sprintf(`gpuhealth_source_up{node=%q,source="kmsg"} %d`, n.Name, want)
		eventuallyWithin(t, 2*pollTimeout, line, func(ctx context.Context) (bool, string, error) {
			body, err := metrics(ctx)
			if err != nil {
				return false, err.Error(), nil
			}
			return strings.Contains(body, line), grepLines(body, "gpuhealth_source_up"), nil
		})
	}

	t.Run("the relay alone is privileged, runs as nobody and has no token", func(t *testing.T) {
		if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
			t.Error("the pod mounts the ServiceAccount token into every container")
		}
		for _, ctr := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			privileged := ctr.SecurityContext != nil && ctr.SecurityContext.Privileged != nil && *ctr.SecurityContext.Privileged
			if privileged != (ctr.Name == "kmsg-relay") {
				t.Errorf("container %s privileged: %v", ctr.Name, privileged)
			}
		}
		relay, agent := containerPID(t, pod, "kmsg-relay"), containerPID(t, pod, "agent")
		creds, err := proccred.Threads(relay)
		if err != nil {
			t.Fatal(err)
		}
		for _, cred := range creds {
			if cred != proccred.Nobody {
				t.Errorf("a thread of the relay has %s, want nobody with no capability", cred)
			}
		}
		token := "var/run/secrets/kubernetes.io/serviceaccount/token"
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(relay), "root", token)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the relay's container has /%s (%v)", token, err)
		}
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(agent), "root", token)); err != nil {
			t.Errorf("the agent's container lacks its token: %v", err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	sourceUp(1)
	// A process's line first (GPU 62): the relay drops it, so once the kernel's lines after it
	// have arrived, GPU 62 is known to be untouched.
	spoof := fmt.Sprintf("<3>NVRM: Xid (PCI:0000:4e:00): 79, pid=%d, name=spoof, GPU has fallen off the bus.\n", os.Getpid())
	if err := writeKmsg(spoof); err != nil {
		t.Fatal(err)
	}
	// XID 79 makes GPU 63 Unhealthy. The same line of an earlier run, still in this boot's log,
	// may have done so already: a line with a code no earlier run logged shows this one's.
	logKernelLine(t, 79)
	waitKernelLine(t, metrics)
	eventually(t, fmt.Sprintf("GPU %d Unhealthy from the kernel's line, the process's ignored", relayGPU), func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, n.Name)
		if err != nil {
			return false, "", err
		}
		body, err := metrics(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		spoofed := grepLines(body, `index="62"`)
		return ann[gpuhealthv1.UnhealthyIDsKey] == strconv.Itoa(relayGPU) && xidCount(body, relayGPU, 79) > 0 && !strings.Contains(spoofed, "gpuhealth_xid_total"),
			fmt.Sprintf("ids=%q, XID 79 on GPU %d counted %d times, GPU 62: %s", ann[gpuhealthv1.UnhealthyIDsKey], relayGPU, xidCount(body, relayGPU, 79), spoofed), nil
	})
	cond, err := nodeCondition(ctx, c, n.Name, corev1.NodeConditionType(gpuhealthv1.ConditionGPUUnhealthy))
	if gpu := fmt.Sprintf("%d (%s)", relayGPU, uuids[relayGPU]); err != nil || cond.Status != corev1.ConditionTrue ||
		!strings.Contains(cond.Message, gpu) || !strings.Contains(cond.Message, "79") {
		t.Errorf("GPUUnhealthy condition %+v (%v), want True naming GPU %s and XID 79", cond, err, gpu)
	}

	t.Run("a relay that dies is restarted and read again", func(t *testing.T) {
		relay := containerPID(t, pod, "kmsg-relay")
		if err := syscall.Kill(relay, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		eventuallyWithin(t, 2*pollTimeout, "the relay restarted", func(ctx context.Context) (bool, string, error) {
			p, err := c.Admin().CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			pod = p
			s := containerStatus(p, "kmsg-relay")
			return s != nil && s.RestartCount > 0 && s.State.Running != nil, fmt.Sprintf("%+v", s), nil
		})
		sourceUp(1)
		waitKernelLine(t, metrics)
		if s := containerStatus(pod, "agent"); s == nil || s.RestartCount != 0 {
			t.Errorf("the agent restarted with the relay: %+v", s)
		}
	})
}

// withDriverLibrary mounts dir, holding the driver's libnvidia-ml.so.1, read-only at path in the
// rendered agent container, as the NVIDIA container runtime mounts the driver's libraries.
func withDriverLibrary(t *testing.T, manifest, dir, path string) string {
	t.Helper()
	objs, err := helm.Decode(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" && o.GetLabels()["app.kubernetes.io/component"] == "agent" {
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
				t.Fatal(err)
			}
			spec := &ds.Spec.Template.Spec
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "nvidia-driver", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir}}})
			for i := range spec.Containers {
				if spec.Containers[i].Name == "agent" {
					spec.Containers[i].VolumeMounts = append(spec.Containers[i].VolumeMounts, corev1.VolumeMount{Name: "nvidia-driver", MountPath: path, ReadOnly: true})
				}
			}
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&ds)
			if err != nil {
				t.Fatal(err)
			}
			o = &unstructured.Unstructured{Object: u}
		}
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	return strings.Join(docs, "\n---\n")
}

func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// containerPID finds the process of a running container of the pod on this machine, by the
// container's cgroup (the node's pods land in /k8s.io/<container ID>).
func containerPID(t *testing.T, p *corev1.Pod, name string) int {
	t.Helper()
	s := containerStatus(p, name)
	if s == nil || s.ContainerID == "" {
		t.Fatalf("no container %s in %+v", name, p.Status)
	}
	id := strings.TrimPrefix(s.ContainerID, "containerd://")
	procs, err := filepath.Glob("/proc/[0-9]*/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, cg := range procs {
		data, err := os.ReadFile(cg)
		if err != nil || !strings.Contains(string(data), "/k8s.io/"+id) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(cg)))
		if err == nil {
			return pid
		}
	}
	t.Fatalf("no process of container %s (%.12s)", name, id)
	return 0
}

var xidTotalRE = regexp.MustCompile(`(?m)^gpuhealth_xid_total\{([^}]*)\} (\d+)$`)

// xidCount is how many times the agent counted XID xid on the GPU of index gpu (0 for never).
func xidCount(body string, gpu, xid int) int {
	for _, m := range xidTotalRE.FindAllStringSubmatch(body, -1) {
		if strings.Contains(m[1], fmt.Sprintf(`index="%d"`, gpu)) && strings.Contains(m[1], fmt.Sprintf(`xid="%d"`, xid)) {
			n, _ := strconv.Atoi(m[2])
			return n
		}
	}
	return 0
}

// waitKernelLine has the kernel log an XID on GPU 63 whose code (100 to 999: three digits fit
// the prefix) the agent has not counted, no earlier run having logged it in this boot, and
// waits until the agent counts it once: the line came through the relay while the test watched.
func waitKernelLine(t *testing.T, metrics func(context.Context) (string, error)) {
	t.Helper()
	body, err := metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	xid := 100 + int(time.Now().UnixNano()%900)
	for xidCount(body, relayGPU, xid) > 0 {
		xid = 100 + (xid-99)%900
	}
	logKernelLine(t, xid)
	eventually(t, fmt.Sprintf("XID %d on GPU %d counted once", xid, relayGPU), func(ctx context.Context) (bool, string, error) {
		body, err := metrics(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return xidCount(body, relayGPU, xid) == 1, grepLines(body, fmt.Sprintf(`index="%d"`, relayGPU)), nil
	})
}

// getInNetNS sends GET path to addr from inside the network namespace of process pid and
// returns the body of a 200 answer.
func getInNetNS(pid int, addr, path string) (string, error) {
	conn, err := dialInNetNS(pid, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return string(body), err
}

// dialInNetNS opens a TCP connection to addr from the network namespace of process pid: the
// socket is made by a goroutine whose thread moves into that namespace and back. Should moving
// back fail, the goroutine ends with its thread still locked, and the thread ends with it.
func dialInNetNS(pid int, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		here, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer here.Close()
		there, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer there.Close()
		if err := unix.Setns(int(there.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- result{err: fmt.Errorf("setns into %d's network: %w", pid, err)}
			return
		}
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if serr := unix.Setns(int(here.Fd()), unix.CLONE_NEWNET); serr != nil {
			if conn != nil {
				_ = conn.Close()
			}
			done <- result{err: fmt.Errorf("setns back: %w", serr)}
			return
		}
		goruntime.UnlockOSThread()
		done <- result{conn, err}
	}()
	r := <-done
	return r.conn, r.err
}

// writeKmsg writes one record to /dev/kmsg, as any root process may: the user facility.
func writeKmsg(line string) error {
	w, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = w.WriteString(line)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// logKernelLine has the kernel log relayKernelLine with xid: a LOG rule on the loopback device,
// matching only a UDP port this test holds, is added, hit by one datagram, and removed.
func logKernelLine(t *testing.T, xid int) {
	t.Helper()
	rx, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	port := strconv.Itoa(rx.LocalAddr().(*net.UDPAddr).Port)
	rule := []string{"OUTPUT", "-o", "lo", "-p", "udp", "--dport", port, "-m", "comment", "--comment", "gpuhealth-e2e-kmsg-relay",
		"-j", "LOG", "--log-prefix", fmt.Sprintf(relayKernelLine, xid), "--log-level", "3"}
	iptables := func(op string) error {
		out, err := exec.Command("iptables", append([]string{"-w", op}, rule...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables %s: %w: %s", op, err, out)
		}
		return nil
	}
	if err := iptables("-I"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := iptables("-D"); err != nil {
			t.Error(err)
		}
	}()
	tx, err := net.Dial("udp4", rx.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if _, err := tx.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	// The hook logs the line while the datagram is sent; reading it back makes sure it was.
	_ = rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := rx.ReadFrom(make([]byte, 8)); err != nil {
		t.Fatalf("the datagram that logs the line: %v", err)
	}
}
