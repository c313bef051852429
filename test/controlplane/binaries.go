package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BinDirEnv names the environment variable that points at a directory holding etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, kubelet, fakecri and nodenet.
// `make e2e` sets it.
const BinDirEnv = "GPUHEALTH_CONTROLPLANE_BIN"

// KubernetesVersion is the version hack/controlplane/build.sh builds; tests check the binaries
// and the running apiserver report it.
const KubernetesVersion = "v1.37.2"

// Binary names inside the bin directory.
const (
	BinEtcd              = "etcd"
	BinAPIServer         = "kube-apiserver"
	BinScheduler         = "kube-scheduler"
	BinControllerManager = "kube-controller-manager"
	BinKubectl           = "kubectl"
	// Real nodes: the kubelet, a fake CRI runtime for it (k8s.io/cri-client's fake, as kubemark
	// uses) and nodenet, which holds the nodes' network namespace.
	BinKubelet = "kubelet"
	BinFakeCRI = "fakecri"
	BinNodeNet = "nodenet"
)

var allBinaries = []string{BinEtcd, BinAPIServer, BinScheduler, BinControllerManager, BinKubectl, BinKubelet, BinFakeCRI, BinNodeNet}

// FindBinDir returns the directory with the control-plane binaries: $GPUHEALTH_CONTROLPLANE_BIN
// if set, otherwise whatever hack/controlplane/build.sh prints after building or finding them in
// its cache. The repository root is found by walking up from the working directory to the
// go.mod that sits next to hack/controlplane/build.sh. build.sh's progress goes to stderr, which
// `go test` shows only for failing or verbose runs, so a first build may look quiet for minutes.
func FindBinDir(ctx context.Context) (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		return checkBinDir(dir)
	}
	dir, err := buildScriptDir(ctx, "build.sh", BinDirEnv)
	if err != nil {
		return "", err
	}
	return checkBinDir(dir)
}

// buildScriptDir runs hack/controlplane/<script>, which builds (or finds cached) binaries and
// prints their directory, and returns that directory. env names the variable that would have
// spared the build, for the error when the repository cannot be found.
func buildScriptDir(ctx context.Context, script, env string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("%s is unset and %w", env, err)
	}
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "controlplane", script))
	cmd.Dir = root
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/controlplane/%s: %w", script, err)
	}
	return strings.TrimSpace(stdout.String()), nil
}

// RepoRoot walks up from the working directory to the directory holding both go.mod and
// hack/controlplane/build.sh (the wrapper modules under hack/ have go.mod files too).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for {
		if fileExists(filepath.Join(dir, "go.mod")) && fileExists(filepath.Join(dir, "hack", "controlplane", "build.sh")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no repository root (go.mod next to hack/controlplane/build.sh) above the working directory")
		}
		dir = parent
	}
}

func checkBinDir(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("empty control-plane bin directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("control-plane bin directory %q: %w", dir, err)
	}
	for _, b := range allBinaries {
		info, err := os.Stat(filepath.Join(abs, b))
		if err != nil {
			return "", fmt.Errorf("control-plane bin directory %s: %w (run hack/controlplane/build.sh)", abs, err)
		}
		if info.Mode()&0o111 == 0 {
			return "", fmt.Errorf("control-plane binary %s is not executable", filepath.Join(abs, b))
		}
	}
	return abs, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
