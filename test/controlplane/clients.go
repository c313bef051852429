package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// Client rate limits: client-go's defaults (5 QPS, burst 10) make busy tests wait on the client
// rather than the server.
const (
	clientQPS   = 100
	clientBurst = 200
)

// serviceAccountTokenSeconds is the lifetime of tokens ServiceAccountConfig requests.
const serviceAccountTokenSeconds = 3600

// baseConfig is a rest.Config for the apiserver with no credentials.
func (c *Cluster) baseConfig() *rest.Config {
	return &rest.Config{
		Host:            c.host,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.ServerCA()},
		QPS:             clientQPS,
		Burst:           clientBurst,
	}
}

// AdminConfig returns a copy of the admin's rest.Config (user AdminUser in system:masters).
func (c *Cluster) AdminConfig() *rest.Config { return rest.CopyConfig(c.admin) }

// Admin returns a clientset acting as the admin.
func (c *Cluster) Admin() *kubernetes.Clientset { return c.adminClient }

// UserConfig returns a rest.Config that authenticates as user, member of groups, with a freshly
// signed client certificate. Any user or group works without restarting anything; what the user
// may do is up to RBAC (and the Node authorizer for system:node:* users in system:nodes).
func (c *Cluster) UserConfig(user string, groups ...string) (*rest.Config, error) {
	certPEM, keyPEM, err := c.ca.issue(user, groups...)
	if err != nil {
		return nil, err
	}
	cfg := c.baseConfig()
	cfg.CertData, cfg.KeyData = certPEM, keyPEM
	return cfg, nil
}

// UserClient is UserConfig wrapped in a clientset.
func (c *Cluster) UserClient(user string, groups ...string) (*kubernetes.Clientset, error) {
	cfg, err := c.UserConfig(user, groups...)
	if err != nil {
		return nil, err
	}
	return newClientset(cfg, user)
}

// NodeConfig returns a rest.Config for the kubelet identity of node (system:node:<node> in
// system:nodes), which the Node authorizer and NodeRestriction admission restrict to that node.
func (c *Cluster) NodeConfig(node string) (*rest.Config, error) {
	return c.UserConfig("system:node:"+node, "system:nodes")
}

// SchedulerConfig returns a rest.Config with kube-scheduler's identity.
func (c *Cluster) SchedulerConfig() (*rest.Config, error) { return c.UserConfig(SchedulerUser) }

// ControllerManagerConfig returns a rest.Config with kube-controller-manager's identity.
func (c *Cluster) ControllerManagerConfig() (*rest.Config, error) {
	return c.UserConfig(ControllerManagerUser)
}

// ServiceAccountConfig returns a rest.Config that authenticates as ServiceAccount
// namespace/name with a bound token from the TokenRequest API (valid one hour), creating the
// ServiceAccount first if it does not exist. The identity is
// system:serviceaccount:<namespace>:<name>; grant it RBAC as the test needs.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	_, err := c.adminClient.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create ServiceAccount %s/%s: %w", namespace, name, err)
	}
	tr, err := c.adminClient.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](serviceAccountTokenSeconds)},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("request token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	cfg := c.baseConfig()
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

// ServiceAccountClient is ServiceAccountConfig wrapped in a clientset.
func (c *Cluster) ServiceAccountClient(ctx context.Context, namespace, name string) (*kubernetes.Clientset, error) {
	cfg, err := c.ServiceAccountConfig(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return newClientset(cfg, "system:serviceaccount:"+namespace+":"+name)
}

// CreateNamespace creates a namespace and makes sure its "default" ServiceAccount exists (the
// controller-manager creates it too, but asynchronously, and not at all when it is disabled;
// pods are refused until it exists).
func (c *Cluster) CreateNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	ns, err := c.adminClient.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "default"}}
	if _, err := c.adminClient.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create default ServiceAccount in %s: %w", name, err)
	}
	return ns, nil
}

// WriteKubeconfig writes cfg (client certificate or bearer token) as a kubeconfig file that
// kubectl and other tools can use.
func (c *Cluster) WriteKubeconfig(path string, cfg *rest.Config) error {
	const name = "gpuhealth"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

func newClientset(cfg *rest.Config, who string) (*kubernetes.Clientset, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clientset for %s: %w", who, err)
	}
	return cs, nil
}
