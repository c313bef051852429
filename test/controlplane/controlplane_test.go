package controlplane

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// These tests need no control-plane binaries; the e2e suite (test/e2e) runs the real thing.

func parseCert(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("no PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestClientCertificates(t *testing.T) {
	ca, err := newClientCA()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)

	tests := []struct {
		name   string
		user   string
		groups []string
	}{
		{name: "admin", user: AdminUser, groups: []string{"system:masters"}},
		{name: "component without groups", user: SchedulerUser},
		{name: "node", user: "system:node:n1", groups: []string{"system:nodes"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			certPEM, keyPEM, err := ca.issue(tc.user, tc.groups...)
			if err != nil {
				t.Fatal(err)
			}
			cert := parseCert(t, certPEM)
			if cert.Subject.CommonName != tc.user || !slices.Equal(cert.Subject.Organization, tc.groups) {
				t.Errorf("subject = %v, want CN=%s O=%v", cert.Subject, tc.user, tc.groups)
			}
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("verify against the client CA: %v", err)
			}
			if block, _ := pem.Decode(keyPEM); block == nil || block.Type != "PRIVATE KEY" {
				t.Errorf("key is not a PKCS#8 PEM block")
			}
		})
	}

	if _, _, err := ca.issue(""); err == nil {
		t.Error("issue with an empty user name succeeded")
	}
}

func TestServingCertificate(t *testing.T) {
	ca, err := newClientCA()
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := ca.issueServing("kube-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	if _, err := parseCert(t, certPEM).Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("serving certificate does not verify for 127.0.0.1: %v", err)
	}
}

func TestServiceAccountKeys(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writeServiceAccountKeys(priv, pub); err != nil {
		t.Fatal(err)
	}
	for path, parse := range map[string]func([]byte) (any, error){
		priv: x509.ParsePKCS8PrivateKey,
		pub:  x509.ParsePKIXPublicKey,
	} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(data)
		if block == nil {
			t.Fatalf("%s: no PEM block", path)
		}
		if _, err := parse(block.Bytes); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
}

func TestGPUResourceSlice(t *testing.T) {
	slice := GPUResourceSlice("node-a", "GPU-a", "GPU-b")
	if slice.Spec.Driver != GPUDriver || slice.Spec.Pool.Name != "node-a" || ptr.Deref(slice.Spec.NodeName, "") != "node-a" {
		t.Errorf("driver/pool/node = %s/%s/%v", slice.Spec.Driver, slice.Spec.Pool.Name, slice.Spec.NodeName)
	}
	if slice.Spec.Pool.ResourceSliceCount != 1 {
		t.Errorf("resourceSliceCount = %d, want 1", slice.Spec.Pool.ResourceSliceCount)
	}
	for i, uuid := range []string{"GPU-a", "GPU-b"} {
		d := slice.Spec.Devices[i]
		if d.Name != GPUDeviceName(i) {
			t.Errorf("device %d name = %s", i, d.Name)
		}
		if got := ptr.Deref(d.Attributes["uuid"].StringValue, ""); got != uuid {
			t.Errorf("device %d uuid = %q, want %q", i, got, uuid)
		}
		if got := ptr.Deref(d.Attributes["index"].IntValue, -1); got != int64(i) {
			t.Errorf("device %d index = %d", i, got)
		}
		if got := ptr.Deref(d.Attributes["type"].StringValue, ""); got != "gpu" {
			t.Errorf("device %d type = %q", i, got)
		}
		if _, ok := d.Capacity["memory"]; !ok {
			t.Errorf("device %d has no memory capacity", i)
		}
	}
	// Devices must not share attribute maps, or tainting one test device would taint others.
	slice.Spec.Devices[0].Attributes["uuid"] = resourcev1.DeviceAttribute{StringValue: ptr.To("changed")}
	if got := ptr.Deref(slice.Spec.Devices[1].Attributes["uuid"].StringValue, ""); got != "GPU-b" {
		t.Errorf("devices share attribute maps")
	}
}

func TestPodWithClaims(t *testing.T) {
	pod := PodWithClaims("ns", "p", "gpu-a", "gpu-b")
	if len(pod.Spec.ResourceClaims) != 2 || len(pod.Spec.Containers[0].Resources.Claims) != 2 {
		t.Fatalf("claims = %+v / %+v", pod.Spec.ResourceClaims, pod.Spec.Containers[0].Resources.Claims)
	}
	for i, name := range []string{"gpu-a", "gpu-b"} {
		ref := pod.Spec.ResourceClaims[i]
		if ref.Name != name || ptr.Deref(ref.ResourceClaimName, "") != name || pod.Spec.Containers[0].Resources.Claims[i].Name != name {
			t.Errorf("claim %d = %+v", i, ref)
		}
	}
}

func TestGPUDeviceTaintRule(t *testing.T) {
	rule := GPUDeviceTaintRule("r", "node-a", "gpu-1", resourcev1.DeviceTaint{Key: "k", Effect: resourcev1.DeviceTaintEffectNoExecute})
	sel := rule.Spec.DeviceSelector
	if ptr.Deref(sel.Driver, "") != GPUDriver || ptr.Deref(sel.Pool, "") != "node-a" || ptr.Deref(sel.Device, "") != "gpu-1" {
		t.Errorf("selector = %+v", sel)
	}
}

func TestProcessStop(t *testing.T) {
	tests := []struct {
		name   string
		script string
	}{
		{name: "exits on SIGTERM", script: "exec sleep 60"},
		{name: "ignores SIGTERM, gets SIGKILL", script: "trap '' TERM; sleep 60 & wait; sleep 60"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "p.log")
			p, err := startProcess("sh", "/bin/sh", []string{"-c", tc.script}, logPath, false)
			if err != nil {
				t.Fatal(err)
			}
			if exited, _ := p.exited(); exited {
				t.Fatal("process exited at once")
			}
			start := time.Now()
			if err := p.stop(500 * time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if exited, _ := p.exited(); !exited {
				t.Error("process still running after stop")
			}
			if elapsed := time.Since(start); elapsed > 10*time.Second {
				t.Errorf("stop took %v", elapsed)
			}
			// The whole process group goes, including the backgrounded sleep (SIGKILL is delivered
			// asynchronously, so give it a moment).
			deadline := time.Now().Add(5 * time.Second)
			for groupAlive(t, p.pid()) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if groupAlive(t, p.pid()) {
				t.Error("process group still has live members")
			}
			if err := p.stop(time.Second); err != nil {
				t.Errorf("second stop: %v", err)
			}
			if !strings.Contains(tailFile(logPath, 5), "/bin/sh") {
				t.Errorf("log does not start with the command line: %q", tailFile(logPath, 5))
			}
		})
	}
}

// groupAlive reports whether any process in process group pgid is alive. Zombies do not count:
// orphans are reaped by init, which in some containers never happens.
func groupAlive(t *testing.T, pgid int) bool {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// Fields after the parenthesised command: state, ppid, pgrp, ...
		rest := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		if len(rest) >= 3 && rest[0] != "Z" && rest[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

func TestTailFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := range 100 {
		b.WriteString("line " + strconv.Itoa(i) + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := tailFile(path, 2), "line 98\nline 99"; got != want {
		t.Errorf("tailFile = %q, want %q", got, want)
	}
	if got := tailFile(filepath.Join(t.TempDir(), "missing"), 2); !strings.Contains(got, "cannot read") {
		t.Errorf("tailFile of a missing file = %q", got)
	}
}

func TestFreePortsAreDistinct(t *testing.T) {
	ports, err := freePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ports)
	if len(slices.Compact(ports)) != 5 {
		t.Errorf("ports not distinct: %v", ports)
	}
}

func TestCheckBinDir(t *testing.T) {
	dir := t.TempDir()
	if _, err := checkBinDir(dir); err == nil {
		t.Fatal("empty directory accepted")
	}
	for _, b := range allBinaries {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := checkBinDir(dir); err != nil || got != dir {
		t.Errorf("checkBinDir = %q, %v; want %q", got, err, dir)
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "hack", "controlplane", "build.sh")); err != nil {
		t.Errorf("RepoRoot = %s without build.sh: %v", root, err)
	}
}

func TestStartWithRetry(t *testing.T) {
	tests := []struct {
		name         string
		scripts      []string // one per attempt; the last repeats
		wantErr      bool
		wantAttempts int
	}{
		{name: "ready at once", scripts: []string{"exec sleep 60"}, wantAttempts: 1},
		{name: "port race then ready", scripts: []string{"echo address already in use; exit 1", "exec sleep 60"}, wantAttempts: 2},
		{name: "always exits", scripts: []string{"echo bad flag; exit 1"}, wantErr: true, wantAttempts: startAttempts},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cluster{}
			dir := t.TempDir()
			var procs []*process
			start := func() (*process, error) {
				script := tc.scripts[min(len(procs), len(tc.scripts)-1)]
				p, err := startProcess("sh", "/bin/sh", []string{"-c", script}, filepath.Join(dir, "sh.log"), false)
				if err == nil {
					procs = append(procs, p)
				}
				return p, err
			}
			// Always "ready", but only after a failing script has had time to exit.
			ready := func(context.Context) error {
				time.Sleep(200 * time.Millisecond)
				return nil
			}
			err := c.startWithRetry(t.Context(), "sh", start, ready)
			for _, p := range procs {
				_ = p.stop(time.Second)
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if tc.wantErr && !strings.Contains(err.Error(), "bad flag") {
				t.Errorf("error does not carry the log tail: %v", err)
			}
			if len(procs) != tc.wantAttempts {
				t.Errorf("%d attempts, want %d", len(procs), tc.wantAttempts)
			}
		})
	}
}

func TestListensOn(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if ok, err := listensOn(os.Getpid(), port); err != nil || !ok {
		t.Errorf("listensOn(self, %d) = %v, %v; want true", port, ok, err)
	}
	other, err := startProcess("sleep", "/bin/sh", []string{"-c", "exec sleep 60"}, filepath.Join(t.TempDir(), "log"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.stop(time.Second) }()
	if ok, err := listensOn(other.pid(), port); err != nil || ok {
		t.Errorf("listensOn(other, %d) = %v, %v; want false (our port, not theirs)", port, ok, err)
	}
	_ = l.Close()
	if ok, err := listensOn(os.Getpid(), port); err != nil || ok {
		t.Errorf("listensOn(self, %d) after close = %v, %v; want false", port, ok, err)
	}
}

func TestSweepStaleDirs(t *testing.T) {
	root := t.TempDir()
	mine := filepath.Join(root, tempDirPattern+"mine")
	gone := filepath.Join(root, tempDirPattern+"gone")
	reused := filepath.Join(root, tempDirPattern+"reused")
	creating := filepath.Join(root, tempDirPattern+"creating")
	other := filepath.Join(root, "something-else")
	for _, d := range []string{mine, gone, reused, creating, other} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeOwner(mine); err != nil {
		t.Fatal(err)
	}
	// PID 2^22 + 1 is above Linux's maximum PID: no such process.
	if err := os.WriteFile(filepath.Join(gone, ownerFile), []byte("4194305 123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Our own PID with another start time: the PID was reused.
	if err := os.WriteFile(filepath.Join(reused, ownerFile), []byte(strconv.Itoa(os.Getpid())+" 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	removed := sweepStaleDirs(root)
	slices.Sort(removed)
	if want := []string{gone, reused}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, d := range []string{mine, creating, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
}
