package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// certValidity is long enough for a demo cluster left running for a while; these certificates
// never leave the machine.
const certValidity = 30 * 24 * time.Hour

// clientCA signs the client certificates that identify users to kube-apiserver
// (--client-ca-file), and the serving certificates of the scheduler and controller-manager. Minting a certificate is cheap (ECDSA P-256), so tests can act as any user
// or group at any time without restarting the apiserver, which a static token file would need.
type clientCA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

func newClientCA() (*clientCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate client CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "gpuhealth-controlplane-client-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-sign client CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse client CA: %w", err)
	}
	return &clientCA{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}, nil
}

// issue returns PEM certificate and key for a client certificate whose common name is the user
// name and whose organizations are the groups: that is how kube-apiserver maps x509 identities.
func (ca *clientCA) issue(user string, groups ...string) (certPEM, keyPEM []byte, err error) {
	if user == "" {
		return nil, nil, fmt.Errorf("issue client certificate: empty user name")
	}
	return ca.sign("client certificate for "+user, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// issueServing returns PEM certificate and key for a serving certificate valid for 127.0.0.1 and
// localhost, used by kube-scheduler and kube-controller-manager so /healthz checks verify TLS.
func (ca *clientCA) issueServing(name string) (certPEM, keyPEM []byte, err error) {
	return ca.sign("serving certificate for "+name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"},
	})
}

// issueServingFor returns PEM certificate and key for a serving certificate valid for the given
// addresses and names (a kubelet's node IP and node name).
func (ca *clientCA) issueServingFor(name string, ips []net.IP, dnsNames []string) (certPEM, keyPEM []byte, err error) {
	return ca.sign("serving certificate for "+name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: ips,
		DNSNames:    dnsNames,
	})
}

// sign fills in key, serial, validity and key usage of tmpl and signs it with the CA.
func (ca *clientCA) sign(what string, tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key for %s: %w", what, err)
	}
	if tmpl.SerialNumber, err = randomSerial(); err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(certValidity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign %s: %w", what, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal key for %s: %w", what, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// writeServiceAccountKeys writes the RSA key pair kube-apiserver signs service-account tokens
// with (private) and verifies them with (public); the controller-manager gets the private key for
// legacy token Secrets. RSA because that is what every component accepts without extra flags.
func writeServiceAccountKeys(privatePath, publicPath string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generate service-account key: %w", err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal service-account private key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("marshal service-account public key: %w", err)
	}
	if err := os.WriteFile(privatePath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), 0o600); err != nil {
		return fmt.Errorf("write service-account private key: %w", err)
	}
	if err := os.WriteFile(publicPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return fmt.Errorf("write service-account public key: %w", err)
	}
	return nil
}

func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, fmt.Errorf("random certificate serial: %w", err)
	}
	return serial, nil
}
