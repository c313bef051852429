// Package helm runs the helm tool on the gpuhealth chart for tests: it finds (or builds, through
// hack/tools.sh) a pinned helm and promtool, lints and renders deployments/helm/gpuhealth, and
// decodes the rendered manifests into objects. The chart tests in this package and the e2e tests that apply
// the chart to a real API server share it.
package helm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// BinaryEnv names a helm binary to use instead of the one hack/tools.sh installs.
const BinaryEnv = "GPUHEALTH_HELM"

// ChartDir is the chart's directory relative to the repository root.
const ChartDir = "deployments/helm/gpuhealth"

// PromtoolEnv names a promtool binary to use instead of the one hack/tools.sh installs.
const PromtoolEnv = "GPUHEALTH_PROMTOOL"

var (
	findOnce, findPromtoolOnce sync.Once
	helmPath, promtoolPath     string
	errFind, errFindPromtool   error
)

// Binary returns the path of a helm binary: $GPUHEALTH_HELM if set, else the pinned helm in
// hack/tools.sh's directory, installing it from Go modules if it is missing (a cold build takes
// minutes; `make` installs it beforehand). The error says why no helm could be had.
func Binary() (string, error) {
	findOnce.Do(func() { helmPath, errFind = findTool(BinaryEnv, "helm") })
	return helmPath, errFind
}

// Promtool returns the path of a promtool binary, found or installed as Binary finds helm.
func Promtool() (string, error) {
	findPromtoolOnce.Do(func() { promtoolPath, errFindPromtool = findTool(PromtoolEnv, "promtool") })
	return promtoolPath, errFindPromtool
}

// findTool returns $env if set, else the tool name from hack/tools.sh's directory, installing it
// there if it is missing.
func findTool(env, name string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	tools := filepath.Join(root, "hack", "tools.sh")
	out, err := exec.Command(tools, "bindir").Output()
	if err != nil {
		return "", fmt.Errorf("hack/tools.sh bindir: %w", err)
	}
	p := filepath.Join(strings.TrimSpace(string(out)), name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	cmd := exec.Command(tools, "install", name)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("hack/tools.sh install %s: %w\n%s", name, err, tail(string(out), 20))
	}
	return p, nil
}

// RepoRoot walks up from the working directory to the directory holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Chart returns the chart's absolute path.
func Chart() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ChartDir), nil
}

// Options say how to render the chart.
type Options struct {
	// Release and Namespace name the release (default "gpuhealth", "gpuhealth-system").
	Release, Namespace string
	// Set are helm --set arguments, "key=value".
	Set []string
	// Values are helm -f files, relative to the repository root unless absolute.
	Values []string
	// SetFile are helm --set-file arguments, "key=path".
	SetFile []string
}

func (o Options) args() []string {
	release, ns := o.Release, o.Namespace
	if release == "" {
		release = "gpuhealth"
	}
	if ns == "" {
		ns = "gpuhealth-system"
	}
	args := []string{release, "--namespace", ns}
	root, _ := RepoRoot()
	for _, f := range o.Values {
		if !filepath.IsAbs(f) {
			f = filepath.Join(root, f)
		}
		args = append(args, "--values", f)
	}
	for _, s := range o.Set {
		args = append(args, "--set", s)
	}
	for _, s := range o.SetFile {
		args = append(args, "--set-file", s)
	}
	return args
}

// Install runs `helm install --create-namespace --wait` of the chart into the cluster of
// kubeconfig and returns helm's output. wait is helm's --timeout.
func Install(ctx context.Context, kubeconfig string, o Options, wait string) (string, error) {
	chart, err := Chart()
	if err != nil {
		return "", err
	}
	a := o.args()
	args := append([]string{"install", a[0], chart, "--kubeconfig", kubeconfig, "--create-namespace", "--wait", "--timeout", wait}, a[1:]...)
	return run(ctx, args...)
}

// Uninstall runs `helm uninstall --wait` of the release o names.
func Uninstall(ctx context.Context, kubeconfig string, o Options, wait string) (string, error) {
	a := o.args()
	return run(ctx, "uninstall", a[0], "--kubeconfig", kubeconfig, "--namespace", a[2], "--wait", "--timeout", wait)
}

// Lint runs `helm lint --strict` on the chart with the options' values.
func Lint(ctx context.Context, o Options) (string, error) {
	chart, err := Chart()
	if err != nil {
		return "", err
	}
	args := append([]string{"lint", "--strict", chart}, o.args()[1:]...)
	return run(ctx, args...)
}

// Template runs `helm template` and returns the rendered manifest.
func Template(ctx context.Context, o Options) (string, error) {
	chart, err := Chart()
	if err != nil {
		return "", err
	}
	a := o.args()
	args := append([]string{"template", a[0], chart}, a[1:]...)
	return run(ctx, args...)
}

func run(ctx context.Context, args ...string) (string, error) {
	bin, err := Binary()
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	// Keep helm away from the user's repositories, plugins and caches.
	home, err := os.MkdirTemp("", "gpuhealth-helm-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(home)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// Decode splits a rendered manifest into objects, skipping empty documents.
func Decode(manifest string) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := r.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decode rendered manifest: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
