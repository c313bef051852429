package extender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

const (
	benchNodes = 5000
	benchGPUs  = 8
)

// benchCluster builds benchNodes nodes of benchGPUs GPUs with the mix a large fleet shows: every
// node carries gpu-health for all its GPUs (as the agent writes it); about 5% have Unhealthy GPUs
// (both annotations), 3% a Degraded one, 1% drained GPUs, 0.5% a malformed Volcano list; about
// 60% run pods holding 1-8 GPUs. Node objects also carry the labels and status a kubelet writes,
// which matters when the scheduler sends them (nodeCacheCapable: false).
func benchCluster(b *testing.B) ([]*corev1.Node, []*corev1.Pod) {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	var nodes []*corev1.Node
	var pods []*corev1.Pod
	for i := range benchNodes {
		name := fmt.Sprintf("gpu-node-%05d", i)
		health := map[string]gpuhealthv1.GPUSummary{}
		var unhealthy []string
		drains := map[string]gpuhealthv1.Drain{}
		for g := range benchGPUs {
			s := gpuhealthv1.GPUSummary{Index: g, Model: "NVIDIA H100 80GB HBM3", Health: "Healthy"}
			uuid := fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", i, g, 0, 0, i*benchGPUs+g)
			switch r := rng.Float64(); {
			case r < 0.05/benchGPUs*2:
				s.Health, s.Reasons = "Unhealthy", []string{"XID79"}
				now := time.Unix(1_800_000_000, 0).UTC()
				s.Since = &now
				unhealthy = append(unhealthy, strconv.Itoa(g))
			case r < 0.08/benchGPUs*2:
				s.Health, s.Reasons = "Degraded", []string{"RowRemapPending"}
			case r < 0.09/benchGPUs*2:
				drains[uuid] = gpuhealthv1.Drain{Index: g, Reason: "maintenance", By: "admin@example.com", At: time.Unix(1_800_000_000, 0).UTC()}
			}
			health[uuid] = s
		}
		ann := map[string]string{gpuhealthv1.HealthKey: mustMarshal(b, health)}
		if len(unhealthy) > 0 {
			ann[gpuhealthv1.UnhealthyIDsKey] = strings.Join(unhealthy, ",")
		}
		if rng.Float64() < 0.005 {
			ann[gpuhealthv1.UnhealthyIDsKey] = "0,,x,-1,99"
		}
		if len(drains) > 0 {
			ann[gpuhealthv1.DrainsKey] = mustMarshal(b, drains)
		}
		n := node(name, benchGPUs, ann)
		n.ResourceVersion = strconv.Itoa(1000 + i)
		n.Labels = map[string]string{
			"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
			"topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", i%3),
		}
		n.Status.Allocatable = n.Status.Capacity.DeepCopy()
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"}}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)}, {Type: corev1.NodeHostName, Address: name}}
		nodes = append(nodes, n)
		if rng.Float64() < 0.6 {
			p := pod(fmt.Sprintf("job-%05d", i), name, scheduling.ResourceGPU, int64(1+rng.IntN(benchGPUs)), nil)
			p.UID = types.UID(fmt.Sprintf("uid-%05d", i))
			pods = append(pods, p)
		}
	}
	return nodes, pods
}

func mustMarshal(b *testing.B, v any) string {
	b.Helper()
	out, err := json.Marshal(v)
	if err != nil {
		b.Fatal(err)
	}
	return string(out)
}

// benchServer is a Server whose state holds the cluster, as its informers would fill it.
func benchServer(b *testing.B, nodes []*corev1.Node, pods []*corev1.Pod) *Server {
	b.Helper()
	s := New(nil, Options{})
	for _, n := range nodes {
		s.state.setNode(n)
	}
	for _, p := range pods {
		h, ok, _ := scheduling.PodHold(p)
		s.state.observe(p.UID, h, ok)
	}
	return s
}

// runFilterBench times whole /filter requests through the handler (decode, filter, encode; no
// network) and reports the median and 99th percentile of one call, in wall-clock time (p50-ms,
// p99-ms) and in the process's CPU time (p50-cpu-ms, p99-cpu-ms: on a shared machine the
// wall-clock tail is mostly other processes holding the core). The recorder's body buffer is
// reused between calls, as net/http writes a reply through a fixed buffer: the allocations
// reported are the extender's own.
func runFilterBench(b *testing.B, h http.Handler, body []byte, check func(*extenderv1.ExtenderFilterResult)) {
	b.Helper()
	runHandlerBench(b, h, "/filter", body, func(reply []byte) {
		var res extenderv1.ExtenderFilterResult
		if err := json.Unmarshal(reply, &res); err != nil || res.Error != "" {
			b.Fatalf("reply: %v %q", err, res.Error)
		}
		check(&res)
	})
}

// runHandlerBench is runFilterBench for any call: it times POSTs of body to path and hands the
// last reply to check.
func runHandlerBench(b *testing.B, h http.Handler, path string, body []byte, check func(reply []byte)) {
	b.Helper()
	durations := make([]time.Duration, 0, b.N)
	cpu := make([]time.Duration, 0, b.N)
	var last *httptest.ResponseRecorder
	var replyBuf bytes.Buffer
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		replyBuf.Reset()
		rec := httptest.NewRecorder()
		rec.Body = &replyBuf
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		cpuStart, cpuOK := processCPU()
		start := time.Now()
		h.ServeHTTP(rec, req)
		durations = append(durations, time.Since(start))
		if cpuEnd, ok := processCPU(); ok && cpuOK {
			cpu = append(cpu, cpuEnd-cpuStart)
		}
		last = rec
	}
	b.StopTimer()
	if last.Code != http.StatusOK {
		b.Fatalf("%s answered %d: %s", path, last.Code, last.Body)
	}
	check(last.Body.Bytes())
	report := func(d []time.Duration, unit string) {
		if len(d) == 0 {
			return
		}
		slices.Sort(d)
		pct := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e6 }
		b.ReportMetric(pct(0.50), "p50"+unit)
		b.ReportMetric(pct(0.99), "p99"+unit)
	}
	report(durations, "-ms")
	report(cpu, "-cpu-ms")
}

func filterArgs(b *testing.B, names []string, nodes *corev1.NodeList) []byte {
	b.Helper()
	p := pod("trainer", "", scheduling.ResourceGPU, 4, nil)
	return []byte(mustMarshal(b, extenderv1.ExtenderArgs{Pod: p, NodeNames: nilIfEmpty(names), Nodes: nodes}))
}

func nilIfEmpty(names []string) *[]string {
	if names == nil {
		return nil
	}
	return &names
}

// BenchmarkExtenderFilter is one /filter call for a 4-GPU pod over 5,000 nodes × 8 GPUs with
// nodeCacheCapable: true (node names in, node names out; health from the informer cache).
func BenchmarkExtenderFilter(b *testing.B) {
	nodes, pods := benchCluster(b)
	s := benchServer(b, nodes, pods)
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	runFilterBench(b, s.Handler(), filterArgs(b, names, nil), func(res *extenderv1.ExtenderFilterResult) {
		if got := len(*res.NodeNames) + len(res.FailedNodes); got != benchNodes {
			b.Fatalf("%d nodes answered, want %d", got, benchNodes)
		}
		b.ReportMetric(float64(len(*res.NodeNames)), "fit-nodes")
	})
}

// BenchmarkExtenderFilterNodeObjects is the same call with nodeCacheCapable: false: the request
// carries all 5,000 Node objects and the reply the ones that fit. The cached parse is reused when
// the resourceVersion matches, so this measures mostly JSON.
func BenchmarkExtenderFilterNodeObjects(b *testing.B) {
	nodes, pods := benchCluster(b)
	s := benchServer(b, nodes, pods)
	s.opts.MaxRequestBytes = 128 << 20 // --max-request-bytes, as nodeCacheCapable: false needs (the default is 8 MiB)
	list := &corev1.NodeList{}
	for _, n := range nodes {
		list.Items = append(list.Items, *n)
	}
	runFilterBench(b, s.Handler(), filterArgs(b, nil, list), func(res *extenderv1.ExtenderFilterResult) {
		if got := len(res.Nodes.Items) + len(res.FailedNodes); got != benchNodes {
			b.Fatalf("%d nodes answered, want %d", got, benchNodes)
		}
	})
}

// BenchmarkExtenderPrioritize is one /prioritize call for a 4-GPU pod, nodeCacheCapable: true,
// naming all 5,000 nodes (the scheduler names only those that passed /filter, here 3,451).
func BenchmarkExtenderPrioritize(b *testing.B) {
	nodes, pods := benchCluster(b)
	s := benchServer(b, nodes, pods)
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	runHandlerBench(b, s.Handler(), "/prioritize", filterArgs(b, names, nil), func(reply []byte) {
		var list extenderv1.HostPriorityList
		if err := json.Unmarshal(reply, &list); err != nil || len(list) != benchNodes {
			b.Fatalf("reply of %d scores (%v), want %d", len(list), err, benchNodes)
		}
	})
}
