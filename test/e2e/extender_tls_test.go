//go:build e2e

package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling/extender"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/tlsfixture"
)

// TestExtenderAcceptsOnlyTheScheduler runs the real kube-scheduler with the extender over HTTPS
// with client certificates, configured as the chart's ConfigMap configures it (enableHTTPS,
// tlsConfig certFile/keyFile/caFile): the scheduler's filter and bind calls get through and the
// pod is bound; the same /bind from anyone else on the network, without the scheduler's client
// certificate, is refused and binds nothing.
func TestExtenderAcceptsOnlyTheScheduler(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlsfixture.NewCA(t, "gpuhealth-extender-ca")
	caFile := ca.Write(t, dir, "ca")
	serverCert, serverKey := ca.Server(t).Write(t, dir, "server")
	clientCert, clientKey := ca.Client(t, "system:kube-scheduler").Write(t, dir, "scheduler")
	cfg, err := extender.TLSConfig(serverCert, serverKey, caFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + ln.Addr().String()
	c := controlplane.StartT(t, controlplane.Options{SchedulerConfigExtra: fmt.Sprintf(`extenders:
- urlPrefix: %q
  enableHTTPS: true
  tlsConfig:
    certFile: %q
    keyFile: %q
    caFile: %q
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  weight: 5
  nodeCacheCapable: true
  httpTimeout: 10s
  managedResources:
  - name: nvidia.com/gpu
    ignoredByScheduler: false
`, url, clientCert, clientKey, caFile)})
	ctx := t.Context()
	startExtender(t, c, ln, extender.Options{Bind: true, Requeue: true, TLS: cfg})
	createGPUNode(t, c, nodeSick, 8)

	// Anyone else: a TLS client that trusts the server but has no client certificate.
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	stranger := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	createGPUPod(t, c, "victim", 1)
	body, _ := json.Marshal(extenderv1.ExtenderBindingArgs{PodName: "victim", PodNamespace: "default", Node: nodeSick})
	resp, err := stranger.Post(url+"/bind", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/bind without the scheduler's certificate: %d, want 401", resp.StatusCode)
	}
	// The scheduler itself binds the pods, through the extender (bindVerb), with its certificate.
	waitScheduled(t, c, "victim", nodeSick)
	createGPUPod(t, c, "second", 2)
	waitScheduled(t, c, "second", nodeSick)
	p, err := c.Admin().CoreV1().Pods("default").Get(ctx, "second", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != nodeSick {
		t.Errorf("second on %q", p.Spec.NodeName)
	}
	resp, err = stranger.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz without a client certificate: %d, want 200 (probes present none)", resp.StatusCode)
	}
}
