//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/agent/agenttest"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// gpuhealthBinary builds cmd/gpuhealth once per test binary, so agents run as real processes
// that a test can kill.
func gpuhealthBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := controlplane.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "gpuhealth-e2e-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "gpuhealth")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/gpuhealth")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

const agentNamespace = "gpuhealth-system"

// agentKubeconfig gives the agent its own ServiceAccount bound to agent.ClusterRoleRules (least
// privilege, never admin) and writes a kubeconfig with its token.
func agentKubeconfig(t *testing.T, c *controlplane.Cluster) string {
	t.Helper()
	ctx := t.Context()
	admin := c.Admin()
	if _, err := c.CreateNamespace(ctx, agentNamespace); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := agenttest.Grant(ctx, admin, "gpuhealth-agent", agentNamespace, "gpuhealth-agent"); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.ServiceAccountConfig(ctx, agentNamespace, "gpuhealth-agent")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "agent.kubeconfig")
	if err := c.WriteKubeconfig(path, cfg); err != nil {
		t.Fatal(err)
	}
	return path
}

// gpuNode creates a Ready node with a ResourceSlice of count GPUs whose UUIDs are the
// simulator's for that node, so the agent's sim backend and the DRA devices agree.
func gpuNode(t *testing.T, c *controlplane.Cluster, node string, count int) []string {
	t.Helper()
	return labelledGPUNode(t, c, node, count, nil)
}

// labelledGPUNode is gpuNode with the Node's labels.
func labelledGPUNode(t *testing.T, c *controlplane.Cluster, node string, count int, labels map[string]string) []string {
	t.Helper()
	ctx := t.Context()
	if _, err := c.CreateReadyNode(ctx, node, labels); err != nil {
		t.Fatal(err)
	}
	uuids := make([]string, count)
	for i := range uuids {
		uuids[i] = sim.GPUUUID(node, i)
	}
	if _, err := c.Admin().ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(node, uuids...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return uuids
}

// agentConfig is the HealthConfig the e2e agents run with: fast sampling, and resyncs far apart
// so that every write a test counts is one the agent chose to make.
const agentConfig = `apiVersion: gpuhealth.dev/v1alpha1
kind: HealthConfig
sampleInterval: 500ms
agent:
  resync: 1h
`

// agentProcess is a running `gpuhealth agent`.
type agentProcess struct {
	t       *testing.T
	cmd     *exec.Cmd
	metrics string
	log     string
	done    chan struct{}
}

type agentSetup struct {
	node, kubeconfig, checkpoint string
	// scenario is the body of a scenario file after its header; empty means no events.
	scenario string
	// gpusExtra is appended inside the scenario's gpus mapping (", migInstances: {...}").
	gpusExtra string
	gpus      int
	// noExecute lets eviction-class faults taint NoExecute.
	noExecute bool
	// breakerFraction, when set, turns the circuit breaker on with that share.
	breakerFraction float64
	// topConfig is appended to the HealthConfig at the top level (a remediation section).
	topConfig string
	// agentConfig is appended inside the agent section, each line indented by two spaces.
	agentConfig string
	// heartbeat, when set, is agent.heartbeat.
	heartbeat time.Duration
}

// startAgent writes the scenario and config and starts an agent, stopped when the test ends.
func startAgent(t *testing.T, s agentSetup) *agentProcess {
	t.Helper()
	dir := t.TempDir()
	scenario := fmt.Sprintf("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: %s\ngpus: {count: %d%s}\n%s", s.node, s.gpus, s.gpusExtra, s.scenario)
	scenarioPath := filepath.Join(dir, "scenario.yaml")
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(scenarioPath, []byte(scenario), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := agentConfig
	if s.noExecute {
		cfg += "  noExecute: true\n"
	}
	if s.breakerFraction > 0 {
		cfg += fmt.Sprintf("  circuitBreaker: {enabled: true, maxFraction: %v, window: 10m, namespace: %s}\n", s.breakerFraction, agentNamespace)
	}
	if s.heartbeat > 0 {
		cfg += fmt.Sprintf("  heartbeat: %v\n", s.heartbeat)
	}
	cfg += s.agentConfig
	cfg += s.topConfig
	if err := os.WriteFile(configPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	a := &agentProcess{t: t, metrics: "http://127.0.0.1:" + strconv.Itoa(port), log: filepath.Join(dir, "agent.log"), done: make(chan struct{})}
	logFile, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command(gpuhealthBinary(t), "agent", "--backend", "sim", "--scenario", scenarioPath,
		"--node-name", s.node, "--kubeconfig", s.kubeconfig, "--config", configPath,
		"--checkpoint", s.checkpoint, "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port), "-v", "2")
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = a.cmd.Wait()
		logFile.Close()
		close(a.done)
	}()
	t.Cleanup(func() {
		a.stop()
		if t.Failed() {
			b, _ := os.ReadFile(a.log)
			t.Logf("agent log (%s):\n%s", s.node, tail(string(b), 80))
		}
	})
	a.waitReady()
	return a
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitReady waits for /readyz: the agent has reconciled every reporter once.
func (a *agentProcess) waitReady() {
	a.t.Helper()
	err := wait.PollUntilContextTimeout(a.t.Context(), 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-a.done:
			return false, fmt.Errorf("agent exited: %v", a.cmd.ProcessState)
		default:
		}
		resp, err := http.Get(a.metrics + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		a.t.Fatalf("agent never became ready: %v", err)
	}
}

// kill ends the agent with SIGKILL: no chance to clean up, as after a crash.
func (a *agentProcess) kill() {
	_ = a.cmd.Process.Kill()
	<-a.done
}

// stop ends the agent with SIGTERM and waits, killing it if it does not stop in time.
func (a *agentProcess) stop() {
	select {
	case <-a.done:
		return
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(15 * time.Second):
		a.t.Errorf("agent did not stop within 15s of SIGTERM")
		a.kill()
	}
}

// writes returns gpuhealth_api_writes_total per reporter, scraped from the agent.
func (a *agentProcess) writes() map[string]int {
	a.t.Helper()
	resp, err := http.Get(a.metrics + "/metrics")
	if err != nil {
		a.t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	return parseWrites(a.t, resp.Body)
}

func parseWrites(t *testing.T, r io.Reader) map[string]int {
	t.Helper()
	out := map[string]int{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, `gpuhealth_api_writes_total{reporter="`)
		if !ok {
			continue
		}
		name, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		out[name] = int(v)
	}
	return out
}

// eventually polls cond until it holds, failing the test with what it last said.
func eventually(t *testing.T, what string, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	eventuallyWithin(t, pollTimeout, what, cond)
}

// eventuallyWithin is eventually with a timeout of its own, for waits that include a scenario's
// scheduled time.
func eventuallyWithin(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, msg, err := cond(ctx)
		last = msg
		return ok, err
	})
	if err != nil {
		t.Fatalf("%s: %v (last seen: %s)", what, err, last)
	}
}

// nodeAnnotations returns the node's annotations.
func nodeAnnotations(ctx context.Context, c *controlplane.Cluster, node string) (map[string]string, error) {
	n, err := c.Admin().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return n.Annotations, nil
}

func nodeCondition(ctx context.Context, c *controlplane.Cluster, node string, typ corev1.NodeConditionType) (corev1.NodeCondition, error) {
	n, err := c.Admin().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return corev1.NodeCondition{}, err
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == typ {
			return cond, nil
		}
	}
	return corev1.NodeCondition{}, nil
}

func httpGet(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// agentKubeconfigOnNode is agentKubeconfig with the ServiceAccount token bound to a pod on node,
// as a DaemonSet pod's token is: the API server then knows the agent's node (user extra
// authentication.kubernetes.io/node-name), which the resourceclaims/driver associated-node
// permission requires.
func agentKubeconfigOnNode(t *testing.T, c *controlplane.Cluster, node string) string {
	t.Helper()
	agentKubeconfig(t, c) // namespace, ServiceAccount, ClusterRole and binding
	ctx := t.Context()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "gpuhealth-agent-" + node},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: "gpuhealth-agent",
			Containers:         []corev1.Container{{Name: "agent", Image: "gpuhealth:e2e"}},
		},
	}
	pod, err := c.Admin().CoreV1().Pods(agentNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Admin().CoreV1().ServiceAccounts(agentNamespace).CreateToken(ctx, "gpuhealth-agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(c.AdminConfig())
	cfg.CertData, cfg.KeyData, cfg.CertFile, cfg.KeyFile = nil, nil, "", ""
	cfg.BearerToken = tr.Status.Token
	path := filepath.Join(t.TempDir(), "agent-"+node+".kubeconfig")
	if err := c.WriteKubeconfig(path, cfg); err != nil {
		t.Fatal(err)
	}
	return path
}
