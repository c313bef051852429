package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Identities of the control-plane components and the admin. The scheduler and controller-manager
// names are the ones the bootstrap RBAC policy binds their roles to.
const (
	AdminUser             = "gpuhealth-admin"
	SchedulerUser         = "system:kube-scheduler"
	ControllerManagerUser = "system:kube-controller-manager"
)

// ServiceAccountIssuer is the apiserver's --service-account-issuer (also the token audience).
const ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// DefaultControllers returns the kube-controller-manager controllers started when
// Options.Controllers is empty: what ServiceAccounts, namespaces, garbage collection, workloads,
// ResourceClaims and taint-based eviction (node and device) need.
//
// node-lifecycle-controller is left out on purpose: fake nodes have no kubelet to renew their
// Lease, so it would mark them NotReady/unreachable and taint them about 50 s after creation.
// Without it a node made Ready by CreateReadyNode stays Ready. Add it (with a heartbeat of your
// own) only to test node lifecycle itself.
func DefaultControllers() []string {
	return []string{
		"serviceaccount-controller",
		"serviceaccount-token-controller",
		"root-ca-certificate-publisher-controller",
		"clusterrole-aggregation-controller",
		"namespace-controller",
		"garbage-collector-controller",
		"pod-garbage-collector-controller",
		"taint-eviction-controller",
		"resourceclaim-controller",
		"device-taint-eviction-controller",
		"deployment-controller",
		"replicaset-controller",
		"daemonset-controller",
		"job-controller",
	}
}

// Options configure Start. The zero value runs everything with the defaults below.
type Options struct {
	// BinDir holds the binaries; empty means FindBinDir.
	BinDir string
	// Dir is the working directory for data, certificates, kubeconfigs and logs. Empty means a
	// fresh temporary directory, removed by Stop unless KeepDir is set.
	Dir     string
	KeepDir bool
	// FeatureGates is passed as --feature-gates to kube-apiserver, kube-scheduler and
	// kube-controller-manager alike (gated fields are dropped silently when the components
	// disagree). Empty keeps the 1.37 defaults, where DRA device taints, DeviceTaintRule and
	// ResourceClaim device status are on.
	FeatureGates string
	// DisableScheduler and DisableControllerManager leave those components out.
	DisableScheduler         bool
	DisableControllerManager bool
	// Controllers is kube-controller-manager's --controllers list; empty means
	// DefaultControllers().
	Controllers []string
	// Extra flags appended to each component's command line (later flags win).
	APIServerFlags         []string
	SchedulerFlags         []string
	ControllerManagerFlags []string
	// SchedulerConfigExtra is YAML appended to the KubeSchedulerConfiguration (v1) the scheduler
	// runs with, for top-level fields the harness does not set itself, such as extenders or
	// profiles. The harness sets clientConnection, leaderElection and the pod backoffs.
	SchedulerConfigExtra string
	// KubeletNodes starts that many real nodes (kubelet v1.37.2 on a fake CRI runtime) named
	// KubeletNodeName(0..n-1) once the control plane runs; StartKubeletNode adds more. Real nodes
	// live in a network namespace of their own (see nodenet.go); kube-apiserver then reaches
	// kubelets through an egress proxy, and kube-controller-manager runs the node-lifecycle
	// controller (when Controllers is empty) so nodes turn schedulable as in a real cluster.
	// Fake nodes (CreateReadyNode) in such a cluster have no heartbeat: the lifecycle controller
	// marks them unreachable after its grace period (40 s).
	KubeletNodes int
	// NodeNetwork prepares the node network without starting nodes, for StartKubeletNode.
	NodeNetwork bool
	// Containers gives real nodes containerd v2 + runc + CNI instead of the fake CRI, so their
	// pods run (containerd.go; CheckContainers says whether this machine can). Needs KubeletNodes
	// or NodeNetwork.
	Containers bool
	// ContainerdBinDir holds containerd, its shim, ctr, crihelper and the pause image; empty
	// means FindContainerdBinDir.
	ContainerdBinDir string
	// NodesDir holds one directory per real node (its kubelet's --root-dir); empty means
	// Dir/nodes. Unix socket paths live there, so keep it short (108-byte limit).
	NodesDir string
	// Detach starts the processes in their own sessions without Pdeathsig, so they outlive this
	// process (cluster-up). Tests leave it false so nothing outlives the test binary.
	Detach bool
	// StartTimeout bounds starting the processes (not building the binaries); default 2 minutes,
	// as a loaded 2-core CI machine can be slow.
	StartTimeout time.Duration
	// Progress, if set, receives one line per start-up step.
	Progress func(msg string)
}

// Cluster is a running control plane. Its methods are safe for concurrent use.
type Cluster struct {
	opts      Options
	binDir    string
	dir       string
	removeDir bool

	ca       *clientCA
	serverCA []byte // kube-apiserver's self-signed serving cert bundle (leaf + its CA)
	host     string

	admin       *rest.Config
	adminClient *kubernetes.Clientset

	// containerdBin is the containerd bin directory when nodes run real containers.
	containerdBin string

	mu    sync.Mutex
	procs []*process // in start order; stopped in reverse

	// apiServerArgs and apiServerPorts keep kube-apiserver's command line across
	// StopAPIServer and StartAPIServer.
	apiServerArgs  []string
	apiServerPorts []int

	// Real nodes: nodeNet holds their network namespace; nodeIPs counts handed-out addresses.
	nodeNet *process
	nodes   map[string]*KubeletNode
	nodeIPs int

	stopOnce sync.Once
	stopErr  error
}

// Component names, used for log files and PID records.
const (
	compEtcd              = "etcd"
	compAPIServer         = "kube-apiserver"
	compScheduler         = "kube-scheduler"
	compControllerManager = "kube-controller-manager"
)

// Start runs etcd and kube-apiserver, then (unless disabled) kube-scheduler and
// kube-controller-manager, and returns once all are ready. On error it stops whatever it started
// and the error carries the tail of the failing component's log.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	withNodes := opts.KubeletNodes > 0 || opts.NodeNetwork
	if len(opts.Controllers) == 0 {
		opts.Controllers = DefaultControllers()
		if withNodes {
			opts.Controllers = append(opts.Controllers, "node-lifecycle-controller")
		}
	}
	if withNodes {
		if err := checkNodeNetworkTools(); err != nil {
			return nil, err
		}
		if opts.DisableControllerManager {
			return nil, errors.New("real nodes need kube-controller-manager (its node-lifecycle controller makes them schedulable)")
		}
	}
	if opts.Containers {
		if !withNodes {
			return nil, errors.New("Options.Containers needs real nodes (KubeletNodes or NodeNetwork)")
		}
		if err := CheckContainers(); err != nil {
			return nil, err
		}
	}
	c := &Cluster{opts: opts}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()

	// Outside StartTimeout: a cold build takes many minutes.
	c.binDir = opts.BinDir
	if c.binDir == "" {
		c.binDir, err = FindBinDir(ctx)
	} else {
		c.binDir, err = checkBinDir(c.binDir)
	}
	if err != nil {
		return nil, err
	}
	if opts.Containers {
		if c.containerdBin, err = FindContainerdBinDir(ctx, opts.ContainerdBinDir); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	started := time.Now()

	c.dir = opts.Dir
	if c.dir == "" {
		for _, dir := range sweepStaleDirs(os.TempDir()) {
			c.progress("removed %s, left behind by a test process that was killed", dir)
		}
		if c.dir, err = os.MkdirTemp("", tempDirPattern); err != nil {
			return nil, fmt.Errorf("create control-plane directory: %w", err)
		}
		c.removeDir = !opts.KeepDir
		if err := writeOwner(c.dir); err != nil {
			return nil, err
		}
	} else if c.dir, err = filepath.Abs(c.dir); err != nil {
		return nil, fmt.Errorf("control-plane directory: %w", err)
	}
	for _, sub := range []string{"etcd", "pki", "apiserver-certs", "kubeconfigs", "logs"} {
		if err := os.MkdirAll(filepath.Join(c.dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("create control-plane directory: %w", err)
		}
	}
	if c.ca, err = newClientCA(); err != nil {
		return nil, err
	}
	if err := os.WriteFile(c.path("pki", "client-ca.crt"), c.ca.certPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write client CA: %w", err)
	}
	if err := writeServiceAccountKeys(c.path("pki", "sa.key"), c.path("pki", "sa.pub")); err != nil {
		return nil, err
	}

	var nodeNetFlags []string
	if withNodes {
		if nodeNetFlags, err = c.nodeNetworkAPIServerFlags(); err != nil {
			return nil, err
		}
	}

	etcdURL, err := c.startEtcd(ctx)
	if err != nil {
		return nil, err
	}
	c.progress("etcd ready at %s (%s)", etcdURL, since(started))
	if err := c.startAPIServer(ctx, etcdURL, nodeNetFlags); err != nil {
		return nil, err
	}
	c.progress("kube-apiserver ready at %s (%s)", c.host, since(started))
	if withNodes {
		if err := c.startNodeNetwork(ctx); err != nil {
			return nil, err
		}
	}

	var wg sync.WaitGroup
	var schedErr, kcmErr error
	if !opts.DisableScheduler {
		wg.Go(func() { schedErr = c.startScheduler(ctx) })
	}
	if !opts.DisableControllerManager {
		wg.Go(func() { kcmErr = c.startControllerManager(ctx) })
	}
	wg.Wait()
	if err := errors.Join(schedErr, kcmErr); err != nil {
		return nil, err
	}
	c.progress("control plane ready (%s)", since(started))
	if err := c.startKubeletNodes(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Stop stops every process Start started, newest first (SIGTERM, then SIGKILL after a grace
// period), and removes the working directory if Start created it. It is idempotent.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		procs := slices.Clone(c.procs)
		nodes := slices.Collect(maps.Values(c.nodes))
		c.mu.Unlock()
		var errs []error
		// Nodes with real containers first: their pods go through the CRI while containerd runs.
		for _, n := range nodes {
			if n.containerd != nil {
				if err := n.stopContainers(); err != nil {
					errs = append(errs, fmt.Errorf("stop node %s: %w", n.Name, err))
				}
			}
		}
		for _, p := range slices.Backward(procs) {
			if err := p.stop(10 * time.Second); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", p.name, err))
			}
		}
		if c.removeDir {
			if err := os.RemoveAll(c.dir); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", c.dir, err))
			}
		}
		c.stopErr = errors.Join(errs...)
	})
	return c.stopErr
}

// Dir is the working directory (data, certificates, kubeconfigs, logs/).
func (c *Cluster) Dir() string { return c.dir }

// BinDir is the directory the binaries were run from.
func (c *Cluster) BinDir() string { return c.binDir }

// Host is kube-apiserver's URL, https://127.0.0.1:<port>.
func (c *Cluster) Host() string { return c.host }

// ServerCA returns the PEM bundle clients trust kube-apiserver with (its --cert-dir self-signed
// serving certificate, which contains the CA that signed it).
func (c *Cluster) ServerCA() []byte { return slices.Clone(c.serverCA) }

// AdminKubeconfig is the path of a kubeconfig for the admin (system:masters) user.
func (c *Cluster) AdminKubeconfig() string { return c.path("kubeconfigs", "admin.kubeconfig") }

// Process describes one running component.
type Process struct {
	Name    string
	PID     int
	Binary  string
	LogPath string
}

// Processes lists the components Start started, in start order.
func (c *Cluster) Processes() []Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Process, 0, len(c.procs))
	for _, p := range c.procs {
		out = append(out, Process{Name: p.name, PID: p.pid(), Binary: p.binary, LogPath: p.logPath})
	}
	return out
}

// WriteLogTails writes the last n lines of every component's log to w.
func (c *Cluster) WriteLogTails(w io.Writer, n int) {
	for _, p := range c.Processes() {
		fmt.Fprintf(w, "===== last %d lines of %s (pid %d) =====\n%s\n", n, p.LogPath, p.PID, tailFile(p.LogPath, n))
	}
}

func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.dir}, elem...)...)
}

func (c *Cluster) progress(format string, args ...any) {
	if c.opts.Progress != nil {
		c.opts.Progress(fmt.Sprintf(format, args...))
	}
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.binDir, name) }

// runOnPorts starts a component that must listen on ports and records it for Stop.
func (c *Cluster) runOnPorts(name string, ports []int, args []string) (*process, error) {
	p, err := startProcess(name, c.bin(name), args, c.path("logs", name+".log"), c.opts.Detach)
	if err != nil {
		return nil, err
	}
	p.ports = ports
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// forget drops a process that failed to start from the list Stop and Processes use.
func (c *Cluster) forget(p *process) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs = slices.DeleteFunc(c.procs, func(q *process) bool { return q == p })
}

// startAttempts bounds retries when a component dies before it is ready. The usual cause is a
// port race: free ports are found by binding :0 and closing, and another test package starting a
// cluster at the same moment can take one before our child binds it.
const startAttempts = 3

// startWithRetry runs start (which starts a process on fresh ports) and ready, retrying with new
// ports when the process exits before it is ready.
func (c *Cluster) startWithRetry(ctx context.Context, name string, start func() (*process, error), ready func(context.Context) error) error {
	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		p, err := start()
		if err != nil {
			return err
		}
		lastErr = waitReady(ctx, p, ready)
		if lastErr == nil {
			return nil
		}
		died, _ := p.exited()
		_ = p.stop(5 * time.Second)
		c.forget(p)
		if !died || ctx.Err() != nil {
			break
		}
		c.progress("%s exited before it was ready (attempt %d/%d), retrying on new ports", name, attempt, startAttempts)
	}
	return lastErr
}

// waitReady polls until the process listens on all its ports and ready succeeds, the process
// exits, or ctx ends. Checking that the process itself owns its ports matters: if another cluster
// took a port in the race described at startAttempts, ready alone could be answered by the other
// cluster's component (another etcd's /health looks just like ours).
func waitReady(ctx context.Context, p *process, ready func(context.Context) error) error {
	var lastErr error
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := exitedEarly(p); err != nil {
			return false, err
		}
		for _, port := range p.ports {
			ok, err := listensOn(p.pid(), port)
			if err != nil {
				return false, err
			}
			if !ok {
				lastErr = fmt.Errorf("%s (pid %d) does not listen on port %d yet", p.name, p.pid(), port)
				return false, nil
			}
		}
		if lastErr = ready(ctx); lastErr != nil {
			return false, nil
		}
		if err := exitedEarly(p); err != nil {
			return false, err
		}
		return true, nil
	})
	if err == nil {
		return nil
	}
	if lastErr != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (last check: %w)", err, lastErr)
	}
	return fmt.Errorf("wait for %s: %w\n----- last lines of %s -----\n%s", p.name, err, p.logPath, p.tail(30))
}

// exitedEarly returns an error if the process has exited.
func exitedEarly(p *process) error {
	exited, err := p.exited()
	if !exited {
		return nil
	}
	if err == nil {
		err = errors.New("exit status 0")
	}
	return fmt.Errorf("%s exited before it was ready: %w", p.name, err)
}

func (c *Cluster) startEtcd(ctx context.Context) (string, error) {
	var clientURL string
	start := func() (*process, error) {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		clientURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		dataDir := c.path("etcd", "data")
		// A failed attempt may have left a half-initialised member behind.
		if err := os.RemoveAll(dataDir); err != nil {
			return nil, fmt.Errorf("clean etcd data directory: %w", err)
		}
		return c.runOnPorts(compEtcd, ports, []string{
			"--name=gpuhealth",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=gpuhealth=" + peerURL,
			"--initial-cluster-state=new",
			// Throwaway data: durability buys nothing and fsync is slow on CI disks.
			"--unsafe-no-fsync",
			"--log-level=warn",
		})
	}
	httpClient := &http.Client{Timeout: 2 * time.Second}
	ready := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, clientURL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
			return fmt.Errorf("etcd /health: %s %s", resp.Status, body)
		}
		return nil
	}
	if err := c.startWithRetry(ctx, compEtcd, start, ready); err != nil {
		return "", err
	}
	return clientURL, nil
}

func (c *Cluster) startAPIServer(ctx context.Context, etcdURL string, extraFlags []string) error {
	certDir := c.path("apiserver-certs")
	start := func() (*process, error) {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		c.host = fmt.Sprintf("https://127.0.0.1:%d", ports[0])
		c.admin, c.adminClient, c.serverCA = nil, nil, nil
		args := []string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports[0]),
			// 127.0.0.1 is refused as advertise address unless nothing reconciles the
			// kubernetes Service endpoints.
			"--advertise-address=127.0.0.1",
			"--endpoint-reconciler-type=none",
			// kube-apiserver writes a self-signed serving certificate here (apiserver.crt holds
			// the leaf and the CA that signed it; clients trust that file).
			"--cert-dir=" + certDir,
			"--client-ca-file=" + c.path("pki", "client-ca.crt"),
			"--authorization-mode=Node,RBAC",
			"--enable-admission-plugins=NodeRestriction",
			// As kubeadm and kind run it: privileged pods are admitted (the chart's hostMounts
			// mode and agent.kernelLog.privileged need them); the default refuses them.
			"--allow-privileged=true",
			"--service-account-issuer=" + ServiceAccountIssuer,
			"--service-account-key-file=" + c.path("pki", "sa.pub"),
			"--service-account-signing-key-file=" + c.path("pki", "sa.key"),
			"--service-cluster-ip-range=10.96.0.0/16",
		}
		if c.opts.FeatureGates != "" {
			args = append(args, "--feature-gates="+c.opts.FeatureGates)
		}
		args = append(args, extraFlags...)
		return c.runOnPorts(compAPIServer, ports, append(args, c.opts.APIServerFlags...))
	}
	ready := func(ctx context.Context) error {
		if c.adminClient == nil {
			// The serving certificate appears a moment after the process starts.
			bundle, err := os.ReadFile(filepath.Join(certDir, "apiserver.crt"))
			if err != nil {
				return fmt.Errorf("serving certificate not written yet: %w", err)
			}
			c.serverCA = bundle
			admin, err := c.UserConfig(AdminUser, "system:masters")
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(admin)
			if err != nil {
				return fmt.Errorf("admin client: %w", err)
			}
			c.admin, c.adminClient = admin, client
		}
		// /readyz includes the RBAC bootstrap post-start hook, so the scheduler's and
		// controller-manager's roles exist once it passes.
		_, err := c.adminClient.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}
	if err := c.startWithRetry(ctx, compAPIServer, start, ready); err != nil {
		return err
	}
	return c.WriteKubeconfig(c.AdminKubeconfig(), c.admin)
}

// componentServing returns the flags that make a scheduler or controller-manager serve /healthz on
// port with a certificate from our CA, plus a client that trusts it.
func (c *Cluster) componentServing(name string, port int) ([]string, *http.Client, error) {
	certPEM, keyPEM, err := c.ca.issueServing(name)
	if err != nil {
		return nil, nil, err
	}
	certPath, keyPath := c.path("pki", name+"-serving.crt"), c.path("pki", name+"-serving.key")
	if err := os.WriteFile(certPath, certPEM, 0o600); err != nil {
		return nil, nil, fmt.Errorf("write %s serving certificate: %w", name, err)
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, nil, fmt.Errorf("write %s serving key: %w", name, err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.ca.cert)
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	return []string{
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + certPath,
		"--tls-private-key-file=" + keyPath,
	}, client, nil
}

func healthz(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s %s", url, resp.Status, body)
	}
	return nil
}

func (c *Cluster) componentKubeconfig(name, user string) (string, error) {
	cfg, err := c.UserConfig(user)
	if err != nil {
		return "", err
	}
	path := c.path("kubeconfigs", name+".kubeconfig")
	return path, c.WriteKubeconfig(path, cfg)
}

func (c *Cluster) startScheduler(ctx context.Context) error {
	kubeconfig, err := c.componentKubeconfig(compScheduler, SchedulerUser)
	if err != nil {
		return err
	}
	// Short pod backoff (default 1 s..10 s) so tests that make a pod schedulable again do not
	// wait ten seconds for the retry.
	configPath := c.path("kube-scheduler.yaml")
	config := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
leaderElection:
  leaderElect: false
podInitialBackoffSeconds: 1
podMaxBackoffSeconds: 2
`, kubeconfig) + c.opts.SchedulerConfigExtra
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		return fmt.Errorf("write scheduler config: %w", err)
	}
	err = c.startServing(ctx, compScheduler, c.opts.SchedulerFlags, func(serving []string) []string {
		return append([]string{
			"--config=" + configPath,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
		}, serving...)
	})
	if err != nil {
		return err
	}
	c.progress("kube-scheduler ready")
	return nil
}

// startServing starts a component that serves /healthz on a free port with a certificate from our
// CA (scheduler, controller-manager) and waits until it is healthy. args gets the serving flags
// and returns the component's own flags; the shared --feature-gates and then extra (which win)
// follow.
func (c *Cluster) startServing(ctx context.Context, name string, extra []string, args func(serving []string) []string) error {
	var healthURL string
	var client *http.Client
	start := func() (*process, error) {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		serving, cl, err := c.componentServing(name, ports[0])
		if err != nil {
			return nil, err
		}
		healthURL, client = fmt.Sprintf("https://127.0.0.1:%d/healthz", ports[0]), cl
		cmdline := args(serving)
		if c.opts.FeatureGates != "" {
			cmdline = append(cmdline, "--feature-gates="+c.opts.FeatureGates)
		}
		return c.runOnPorts(name, ports, append(cmdline, extra...))
	}
	ready := func(ctx context.Context) error { return healthz(ctx, client, healthURL) }
	return c.startWithRetry(ctx, name, start, ready)
}

func (c *Cluster) startControllerManager(ctx context.Context) error {
	kubeconfig, err := c.componentKubeconfig(compControllerManager, ControllerManagerUser)
	if err != nil {
		return err
	}
	err = c.startServing(ctx, compControllerManager, c.opts.ControllerManagerFlags, func(serving []string) []string {
		return append([]string{
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--leader-elect=false",
			// Each controller acts as its own ServiceAccount in kube-system, as in kubeadm
			// clusters, so RBAC is exercised per controller.
			"--use-service-account-credentials=true",
			"--service-account-private-key-file=" + c.path("pki", "sa.key"),
			"--root-ca-file=" + filepath.Join(c.path("apiserver-certs"), "apiserver.crt"),
			"--controllers=" + strings.Join(c.opts.Controllers, ","),
			// Log evictions and claim deallocation, which e2e failures usually hinge on.
			"--v=2",
		}, serving...)
	})
	if err != nil {
		return err
	}
	// /healthz passes before the controllers run; the default ServiceAccount appearing proves the
	// controllers started (pods cannot be created in a namespace before it exists).
	if slices.Contains(c.opts.Controllers, "serviceaccount-controller") || slices.Contains(c.opts.Controllers, "*") {
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			_, err := c.adminClient.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil, err
		})
		if err != nil {
			return fmt.Errorf("wait for the controller-manager to create the default ServiceAccount: %w", err)
		}
	}
	c.progress("kube-controller-manager ready")
	return nil
}

// freePorts returns n distinct TCP ports free on 127.0.0.1 right now.
func freePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(10 * time.Millisecond) }
