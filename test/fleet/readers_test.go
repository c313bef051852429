//go:build e2e

package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	"github.com/gpuhealth/gpuhealth/internal/scheduling/extender"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// The cluster-side readers over the whole fleet (GPUHEALTH_FLEET_READERS=1): the extender and the
// breaker's counter in this process, as the agents run, against the same API server, and
// `gpuhealth status` as the command an operator runs; and the control plane's own memory.

// filterCalls is how many /filter calls the extender's p99 is taken over.
const filterCalls = 200

// measureReaders measures the extender, the breaker counter and `gpuhealth status` in turn.
func measureReaders(t *testing.T, c *controlplane.Cluster, adminCfg *rest.Config, fleet []*fleetNode, fig *Figures) {
	t.Helper()
	measureExtender(t, adminCfg, fleet, fig)
	measureCounter(t, adminCfg, fig)
	measureStatus(t, c, fig)
}

// measureExtender starts the extender's informers (extender.Server.Start, as `gpuhealth extender`
// runs them) over the fleet, takes the heap and RSS its cache adds, and times filterCalls /filter
// calls for a 4-GPU pod naming every node (nodeCacheCapable), one after another over loopback.
func measureExtender(t *testing.T, adminCfg *rest.Config, fleet []*fleetNode, fig *Figures) {
	t.Helper()
	ctx, stop := context.WithCancel(klog.NewContext(t.Context(), logr.Discard()))
	defer stop()
	client, err := kubernetes.NewForConfig(protobuf(adminCfg))
	if err != nil {
		t.Fatal(err)
	}
	heap0, rss0, _ := memory(t)
	s := extender.New(client, extender.Options{AgentNamespace: agentNamespace, StaleAfter: gpuhealthv1.DefaultStaleAfter})
	start := time.Now()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	fig.ExtenderSyncSeconds = time.Since(start).Seconds()
	heap1, rss1, _ := memory(t)
	fig.ExtenderHeapMiB, fig.ExtenderRSSMiB = mib(int64(heap1)-int64(heap0)), mib(int64(rss1)-int64(rss0))

	names := make([]string, len(fleet))
	for i, n := range fleet {
		names[i] = n.name
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "default", UID: "trainer-uid"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{scheduling.ResourceGPU: resource.MustParse("4")},
		}}}},
	}
	body, err := json.Marshal(extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	var durations []time.Duration
	var fit int
	for range filterCalls {
		start := time.Now()
		resp, err := http.Post(srv.URL+"/filter", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		reply, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		durations = append(durations, time.Since(start))
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/filter: %d %v %s", resp.StatusCode, err, reply)
		}
		var res extenderv1.ExtenderFilterResult
		if err := json.Unmarshal(reply, &res); err != nil || res.Error != "" {
			t.Fatalf("/filter reply: %v %q", err, res.Error)
		}
		if res.NodeNames != nil {
			fit = len(*res.NodeNames)
		}
		if got := fit + len(res.FailedNodes) + len(res.FailedAndUnresolvableNodes); got != len(fleet) {
			t.Fatalf("/filter answered for %d nodes, want %d", got, len(fleet))
		}
	}
	fig.FilterCalls, fig.FilterFitNodes, fig.FilterRequestBytes = len(durations), fit, len(body)
	fig.Filter = percentiles(durations)
	t.Logf("extender: caches of %d nodes synced in %.1fs, heap +%.0f MiB, RSS +%.0f MiB; /filter %s (%d nodes fit)",
		len(fleet), fig.ExtenderSyncSeconds, fig.ExtenderHeapMiB, fig.ExtenderRSSMiB, fig.Filter, fit)
}

// measureCounter runs the breaker's counter (breaker.Counter, as `gpuhealth breaker controller`
// runs it) from nothing, as after a restart or a failover, and times it until the breaker's
// ConfigMap holds the fleet's GPU count; then takes the heap and RSS its caches add.
func measureCounter(t *testing.T, adminCfg *rest.Config, fig *Figures) {
	t.Helper()
	client, err := kubernetes.NewForConfig(protobuf(adminCfg))
	if err != nil {
		t.Fatal(err)
	}
	heap0, rss0, _ := memory(t)
	ctx, stop := context.WithCancel(klog.NewContext(t.Context(), logr.Discard()))
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- (&breaker.Counter{Client: adapt.Clientset(client), Namespace: agentNamespace}).Run(ctx)
	}()
	waitBreakerCount(t, client, fig.GPUs)
	fig.CounterRecountSeconds = time.Since(start).Seconds()
	heap1, rss1, _ := memory(t)
	fig.CounterHeapMiB, fig.CounterRSSMiB = mib(int64(heap1)-int64(heap0)), mib(int64(rss1)-int64(rss0))
	stop()
	if err := <-done; err != nil {
		t.Errorf("breaker counter: %v", err)
	}
	t.Logf("breaker counter: %d GPUs counted %.1fs after its start; heap +%.0f MiB, RSS +%.0f MiB", fig.GPUs, fig.CounterRecountSeconds, fig.CounterHeapMiB, fig.CounterRSSMiB)
}

// measureStatus runs `gpuhealth status -o json` over the whole fleet as its own process (the
// binary GPUHEALTH_FLEET_GPUHEALTH names, else one built here) and takes its wall time and its
// peak RSS (getrusage's maxrss). A run that takes longer than GPUHEALTH_FLEET_STATUS_LIMIT
// (default 3m) is stopped there and reported as such (StatusTimedOut), so that the run's other
// figures are still written.
func measureStatus(t *testing.T, c *controlplane.Cluster, fig *Figures) {
	t.Helper()
	bin := os.Getenv("GPUHEALTH_FLEET_GPUHEALTH")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "gpuhealth")
		build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/gpuhealth/gpuhealth/cmd/gpuhealth")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build gpuhealth: %v\n%s", err, out)
		}
	}
	var out countingWriter
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), envDuration(t, "GPUHEALTH_FLEET_STATUS_LIMIT", 3*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "status", "--kubeconfig", c.AdminKubeconfig(), "-o", "json", "--agent-namespace", agentNamespace)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	start := time.Now()
	err := cmd.Run()
	fig.StatusSeconds = time.Since(start).Seconds()
	switch {
	case ctx.Err() != nil && t.Context().Err() == nil:
		fig.StatusTimedOut = true
		t.Logf("gpuhealth status: stopped after %.0fs, unfinished", fig.StatusSeconds)
	case err != nil:
		t.Fatalf("gpuhealth status: %v\n%s", err, stderr.String())
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		fig.StatusMaxRSSMiB = float64(ru.Maxrss) / 1024 // KiB on Linux
	}
	fig.StatusOutputMiB = mib(out.n)
	t.Logf("gpuhealth status: %d nodes in %.1fs, peak RSS %.0f MiB, %.0f MiB of JSON", fig.Nodes, fig.StatusSeconds, fig.StatusMaxRSSMiB, fig.StatusOutputMiB)
}

type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// protobuf is cfg speaking protobuf (as the project's components do) without a client-side limit.
func protobuf(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.ContentType = "application/vnd.kubernetes.protobuf"
	out.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	out.QPS = -1
	return out
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// controlPlaneMemory reads the RSS and the peak RSS (VmRSS, VmHWM) of the kube-apiserver and
// etcd, in MiB, from /proc of their processes.
func controlPlaneMemory(t *testing.T, c *controlplane.Cluster) map[string][2]float64 {
	t.Helper()
	out := map[string][2]float64{}
	for _, p := range c.Processes() {
		if p.Name != "kube-apiserver" && p.Name != "etcd" {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
		if err != nil {
			t.Fatal(err)
		}
		var rss, hwm float64
		for line := range strings.Lines(string(status)) {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			kib, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case "VmRSS:":
				rss = kib / 1024
			case "VmHWM:":
				hwm = kib / 1024
			}
		}
		out[p.Name] = [2]float64{rss, hwm}
	}
	if len(out) != 2 {
		t.Fatalf("kube-apiserver and etcd not among the control plane's processes %+v", c.Processes())
	}
	return out
}
