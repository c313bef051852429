package extender

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLSConfig is the extender's HTTPS configuration: the serving certificate from certFile and
// keyFile, and client certificates verified against the CAs in caFile. It asks for a client
// certificate without demanding one at the handshake (VerifyClientCertIfGiven: the kubelet's
// probes and Prometheus present none, for /healthz and /metrics); the scheduler verbs then refuse
// a call without a verified one (Options.TLS). A certificate from another CA fails the handshake.
func TLSConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file, --tls-private-key-file: %w", err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--client-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--client-ca-file %s: no PEM certificate in it", caFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven,
		MinVersion: tls.VersionTLS12}, nil
}
