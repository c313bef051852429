package helm

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpuhealth/gpuhealth/internal/scheduling/extender"
)

// TestExtenderTLSCertificatesWork renders the chart's extender with the certificates it makes and
// uses them as the running pieces would: `gpuhealth extender`'s own TLS configuration
// (extender.TLSConfig) loads the serving Secret's files, and a client with the scheduler-client
// Secret's files completes a handshake with it, verifying the server as the Service's DNS name and
// presenting a certificate the server verifies. A client certificate is required of the scheduler
// verbs, not of the probes (scheme HTTPS, no client certificate).
func TestExtenderTLSCertificatesWork(t *testing.T) {
	r := render(t, "extender.enabled=true", "extender.bind=true")
	var server, client corev1.Secret
	r.get(t, "Secret", "gpuhealth-extender-tls", &server)
	r.get(t, "Secret", "gpuhealth-extender-scheduler-client", &client)
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cfg, err := extender.TLSConfig(write("tls.crt", server.Data["tls.crt"]), write("tls.key", server.Data["tls.key"]), write("ca.crt", server.Data["ca.crt"]))
	if err != nil {
		t.Fatalf("the extender cannot load the chart's serving Secret: %v", err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	verified := make(chan int, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			verified <- -1
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			verified <- -1
			return
		}
		verified <- len(tc.ConnectionState().VerifiedChains)
	}()
	pair, err := tls.X509KeyPair(client.Data["tls.crt"], client.Data["tls.key"])
	if err != nil {
		t.Fatalf("the scheduler-client Secret: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(client.Data["ca.crt"]) {
		t.Fatal("the scheduler-client Secret's ca.crt holds no certificate")
	}
	conn, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair},
		ServerName: "gpuhealth-extender." + testNamespace + ".svc", MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("kube-scheduler's handshake with the extender, as the Service's DNS name: %v", err)
	}
	_ = conn.Close()
	if n := <-verified; n < 1 {
		t.Errorf("the extender verified %d chains of the scheduler's client certificate, want one", n)
	}

	var d appsv1.Deployment
	r.get(t, "Deployment", "gpuhealth-extender", &d)
	c := d.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--tls-cert-file=/etc/gpuhealth/tls/tls.crt", "--tls-private-key-file=/etc/gpuhealth/tls/tls.key", "--client-ca-file=/etc/gpuhealth/tls/ca.crt"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("extender args %v lack %s", c.Args, want)
		}
	}
	if slices.Contains(c.Args, "--insecure") || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS || c.LivenessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("args %v, probes %s/%s: want HTTPS", c.Args, c.ReadinessProbe.HTTPGet.Scheme, c.LivenessProbe.HTTPGet.Scheme)
	}
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2", *d.Spec.Replicas)
	}
	var pdb policyv1.PodDisruptionBudget
	r.get(t, "PodDisruptionBudget", "gpuhealth-extender", &pdb)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget %+v, want maxUnavailable 1", pdb.Spec)
	}
	if r.has("NetworkPolicy", "gpuhealth-extender") {
		t.Error("a NetworkPolicy by default (it would shut out a hostNetwork scheduler)")
	}
}

// TestExtenderTLSOptions: plain HTTP only when asked for (--insecure, HTTP probes and URL); a Secret
// of the user's replaces the chart's certificates; the NetworkPolicy admits what it is told.
func TestExtenderTLSOptions(t *testing.T) {
	t.Run("tls off", func(t *testing.T) {
		r := render(t, "extender.enabled=true", "extender.tls.enabled=false")
		var d appsv1.Deployment
		r.get(t, "Deployment", "gpuhealth-extender", &d)
		c := d.Spec.Template.Spec.Containers[0]
		if !slices.Contains(c.Args, "--insecure") || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTP || r.has("Secret", "gpuhealth-extender-tls") {
			t.Errorf("args %v, probe %s: want --insecure over HTTP and no certificates", c.Args, c.ReadinessProbe.HTTPGet.Scheme)
		}
		var cm corev1.ConfigMap
		r.get(t, "ConfigMap", "gpuhealth-extender-scheduler-config", &cm)
		if sc := cm.Data["scheduler-config.yaml"]; !strings.Contains(sc, "urlPrefix: http://") || strings.Contains(sc, "enableHTTPS") {
			t.Errorf("scheduler config:\n%s", sc)
		}
	})
	t.Run("own secret", func(t *testing.T) {
		r := render(t, "extender.enabled=true", "extender.tls.secretName=mine")
		if r.has("Secret", "gpuhealth-extender-tls") || r.has("Secret", "gpuhealth-extender-scheduler-client") {
			t.Error("the chart made certificates beside the user's Secret")
		}
		var d appsv1.Deployment
		r.get(t, "Deployment", "gpuhealth-extender", &d)
		if v := d.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].Secret == nil || v[0].Secret.SecretName != "mine" {
			t.Errorf("volumes %+v, want the Secret mine", v)
		}
	})
	t.Run("cert-manager issuer", func(t *testing.T) {
		r := render(t, "extender.enabled=true", "extender.tls.certManager.issuerRef.name=cluster-ca", "extender.tls.certManager.issuerRef.kind=ClusterIssuer")
		if r.has("Secret", "gpuhealth-extender-tls") || r.has("Secret", "gpuhealth-extender-scheduler-client") {
			t.Error("the chart made certificates beside cert-manager's")
		}
		for name, usage := range map[string]string{"gpuhealth-extender-tls": "server auth", "gpuhealth-extender-scheduler-client": "client auth"} {
			c, ok := r["Certificate/"+name]
			if !ok {
				t.Fatalf("no Certificate %s; have %v", name, r.keys())
			}
			spec, _, _ := unstructured.NestedMap(c.Object, "spec")
			usages, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "usages")
			kind, _, _ := unstructured.NestedString(c.Object, "spec", "issuerRef", "kind")
			if spec["secretName"] != name || kind != "ClusterIssuer" || !slices.Contains(usages, usage) {
				t.Errorf("Certificate %s: %v", name, spec)
			}
		}
		server := r["Certificate/gpuhealth-extender-tls"]
		dns, _, _ := unstructured.NestedStringSlice(server.Object, "spec", "dnsNames")
		if !slices.Contains(dns, "gpuhealth-extender."+testNamespace+".svc") {
			t.Errorf("serving certificate for %v, not the Service's name", dns)
		}
		cn, _, _ := unstructured.NestedString(r["Certificate/gpuhealth-extender-scheduler-client"].Object, "spec", "commonName")
		if cn != "system:kube-scheduler" {
			t.Errorf("client certificate for %q", cn)
		}
		var d appsv1.Deployment
		r.get(t, "Deployment", "gpuhealth-extender", &d)
		if v := d.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].Secret == nil || v[0].Secret.SecretName != "gpuhealth-extender-tls" {
			t.Errorf("volumes %+v, want cert-manager's Secret", v)
		}
	})
	t.Run("network policy", func(t *testing.T) {
		r := render(t, "extender.enabled=true", "extender.networkPolicy.enabled=true")
		var np networkingv1.NetworkPolicy
		r.get(t, "NetworkPolicy", "gpuhealth-extender", &np)
		if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["component"] != "kube-scheduler" ||
			np.Spec.Ingress[0].Ports[0].Port.IntValue() != 8888 {
			t.Errorf("NetworkPolicy %+v", np.Spec)
		}
	})
}
