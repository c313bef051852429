package cli_test

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/cli"
)

func TestExtenderBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"listen address without port", []string{"extender", "--listen-address", "127.0.0.1"}, "--listen-address"},
		{"missing kubeconfig", []string{"extender", "--insecure", "--listen-address", "127.0.0.1:0", "--kubeconfig", "/nonexistent/kubeconfig"}, "kubeconfig"},
		{"no TLS and no --insecure", []string{"extender", "--listen-address", "127.0.0.1:0"}, "--tls-cert-file, --tls-private-key-file, --client-ca-file: required"},
		{"no client CA", []string{"extender", "--tls-cert-file", "/x.crt", "--tls-private-key-file", "/x.key"}, "--client-ca-file: required"},
		{"insecure with TLS", []string{"extender", "--insecure", "--tls-cert-file", "/x.crt"}, "--insecure serves plain HTTP"},
		{"unreadable certificate", []string{"extender", "--tls-cert-file", "/nonexistent.crt", "--tls-private-key-file", "/nonexistent.key", "--client-ca-file", "/nonexistent-ca.crt"}, "--tls-cert-file, --tls-private-key-file"},
		{"concurrency", []string{"extender", "--insecure", "--max-concurrent-requests", "0"}, "--max-concurrent-requests"},
		{"request limit", []string{"extender", "--max-request-bytes", "0"}, "--max-request-bytes"},
		{"log format", []string{"extender", "--log-format", "xml"}, "--log-format"},
		{"argument", []string{"extender", "extra"}, "unknown command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := execute(tc.args...)
			if code != cli.ExitBadInput || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d mentioning %q", code, stderr, cli.ExitBadInput, tc.want)
			}
		})
	}
}

func TestExtenderHelp(t *testing.T) {
	code, stdout, _ := execute("extender", "--help")
	if code != cli.ExitOK || !strings.Contains(stdout, "--bind") || !strings.Contains(stdout, "--listen-address") {
		t.Errorf("exit %d, help:\n%s", code, stdout)
	}
}
