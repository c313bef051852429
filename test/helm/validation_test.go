package helm

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
	"github.com/gpuhealth/gpuhealth/pkg/health/validation"
)

const (
	// dcgmDir is where the agent finds the copied dcgmi, its libraries and its loader.
	dcgmDir       = "/opt/gpuhealth/dcgm"
	dcgmCopyName  = "dcgm-copy"
	testDCGMImage = "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
)

var validationOn = []string{"config.remediation.enabled=true", "config.remediation.validation.enabled=true"}

// renderedAgent is what the tests read of the rendered agent: its pod and its HealthConfig, as
// the agent's own strict loader reads it.
type renderedAgent struct {
	pod    corev1.PodSpec
	config *config.HealthConfig
	raw    string
}

func renderAgent(t *testing.T, o Options) renderedAgent {
	t.Helper()
	r := renderWith(t, o)
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "gpuhealth-agent", &ds)
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", "gpuhealth-agent-config", &cm)
	raw := cm.Data["healthconfig.yaml"]
	cfg, err := config.Parse([]byte(raw))
	if err != nil {
		t.Fatalf("the rendered HealthConfig does not load: %v\n%s", err, raw)
	}
	return renderedAgent{pod: ds.Spec.Template.Spec, config: cfg, raw: raw}
}

func (a renderedAgent) container(t *testing.T, name string) corev1.Container {
	t.Helper()
	i := slices.IndexFunc(a.pod.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("no container %s", name)
	}
	return a.pod.Containers[i]
}

// runOnceInits are the pod's init containers that run to completion before the others start
// (dcgm-copy), without the sidecars that run beside them (kmsg-relay).
func (a renderedAgent) runOnceInits() []corev1.Container {
	var out []corev1.Container
	for _, c := range a.pod.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			out = append(out, c)
		}
	}
	return out
}

func envVar(c corev1.Container, name string) *corev1.EnvVar {
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return nil
	}
	return &c.Env[i]
}

func releaseWith(set ...string) Options {
	return Options{Release: "gpuhealth", Namespace: testNamespace, Set: set}
}

// TestValidationChart: validation changes the agent's pod only when it is on: HOST_IP from the
// downward API (for {hostIP}) on the agent container, and, with agent.validation.dcgmImage, the
// dcgm-copy init container, its emptyDir, a read-only mount in the agent and the command run
// through the copied loader. Each HealthConfig loads through the agent's own strict loader.
func TestValidationChart(t *testing.T) {
	requireHelm(t)
	copyCommand := append([]string{dcgmDir + "/ld.so", "--library-path", dcgmDir + "/lib", dcgmDir + "/dcgmi"}, config.DefaultValidationCommand()[1:]...)
	for _, tc := range []struct {
		name string
		set  []string
		// values is a values file of the case's own (--set cannot write {uuid}).
		values string
		// want: validation on, HOST_IP set, the init container rendered, the command run.
		validation, hostIP, copies bool
		command                    []string
	}{
		{name: "defaults", command: config.DefaultValidationCommand()},
		{name: "remediation alone", set: []string{"config.remediation.enabled=true"}, command: config.DefaultValidationCommand()},
		{name: "an image but validation off", set: []string{"config.remediation.enabled=true", "agent.validation.dcgmImage=" + testDCGMImage}, command: config.DefaultValidationCommand()},
		{name: "validation without an image", set: validationOn, validation: true, hostIP: true, command: config.DefaultValidationCommand()},
		{name: "validation with an image", set: append(slices.Clone(validationOn), "agent.validation.dcgmImage="+testDCGMImage),
			validation: true, hostIP: true, copies: true, command: copyCommand},
		{name: "an image and a command of another program", set: append(slices.Clone(validationOn), "agent.validation.dcgmImage="+testDCGMImage),
			values:     "config: {remediation: {validation: {command: [/usr/local/bin/gpu-burn, '{uuid}'], format: exitCode}}}",
			validation: true, hostIP: true, copies: true, command: []string{"/usr/local/bin/gpu-burn", "{uuid}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := releaseWith(tc.set...)
			if tc.values != "" {
				f := filepath.Join(t.TempDir(), "values.yaml")
				if err := os.WriteFile(f, []byte(tc.values), 0o600); err != nil {
					t.Fatal(err)
				}
				o.Values = []string{f}
			}
			if out, err := Lint(context.Background(), o); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			a := renderAgent(t, o)
			v := a.config.Remediation.Validation
			if v.Enabled != tc.validation {
				t.Errorf("remediation.validation.enabled = %v, want %v\n%s", v.Enabled, tc.validation, a.raw)
			}
			if got := a.config.Remediation.WithDefaults().Validation.Command; !slices.Equal(got, tc.command) {
				t.Errorf("validation command %q, want %q", got, tc.command)
			}
			agentC := a.container(t, "agent")
			hostIP := envVar(agentC, "HOST_IP")
			if (hostIP != nil) != tc.hostIP {
				t.Errorf("HOST_IP in the agent's environment: %v, want %v", hostIP != nil, tc.hostIP)
			}
			if hostIP != nil && (hostIP.ValueFrom == nil || hostIP.ValueFrom.FieldRef == nil || hostIP.ValueFrom.FieldRef.FieldPath != "status.hostIP") {
				t.Errorf("HOST_IP = %+v, want the downward API's status.hostIP", hostIP)
			}
			checkDCGMCopy(t, a, tc.copies)
			// The agent validates with what remediation already holds: its slots, its Events.
			if tc.validation {
				var role rbacv1.Role
				renderWith(t, o).get(t, "Role", "gpuhealth-agent-remediation", &role)
				if want := agent.RemediationRoleRules(1); !equality.Semantic.DeepEqual(role.Rules, want) {
					t.Errorf("with validation the remediation Role differs from agent.RemediationRoleRules(1):\n got %s\nwant %s", rulesString(role.Rules), rulesString(want))
				}
			}
		})
	}
}

// checkDCGMCopy checks the dcgm-copy init container, its volume and the agent's mount: all
// there, or none.
func checkDCGMCopy(t *testing.T, a renderedAgent, want bool) {
	t.Helper()
	vol := slices.IndexFunc(a.pod.Volumes, func(v corev1.Volume) bool { return v.Name == "dcgm" })
	agentC := a.container(t, "agent")
	mount := slices.IndexFunc(agentC.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "dcgm" })
	if !want {
		if len(a.runOnceInits()) > 0 || vol >= 0 || mount >= 0 {
			t.Errorf("a dcgmi copy nobody asked for: init containers %v, volume %v, mount %v", a.runOnceInits(), vol >= 0, mount >= 0)
		}
		return
	}
	if len(a.runOnceInits()) != 1 || a.runOnceInits()[0].Name != dcgmCopyName {
		t.Fatalf("init containers %+v, want %s alone", a.runOnceInits(), dcgmCopyName)
	}
	ic := a.runOnceInits()[0]
	if ic.Image != testDCGMImage || ic.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("init container image %s (%s), want %s", ic.Image, ic.ImagePullPolicy, testDCGMImage)
	}
	if !slices.Equal(ic.Command, []string{"/bin/sh", "-c"}) || len(ic.Args) != 1 {
		t.Errorf("init container runs %q %q, want /bin/sh -c SCRIPT", ic.Command, ic.Args)
	}
	for name, value := range map[string]string{"DCGMI": "dcgmi", "DEST": dcgmDir, "NVIDIA_VISIBLE_DEVICES": "void"} {
		if e := envVar(ic, name); e == nil || e.Value != value {
			t.Errorf("init container %s = %+v, want %q", name, e, value)
		}
	}
	if len(ic.Resources.Claims) > 0 || slices.ContainsFunc(slices.Concat(keys(ic.Resources.Requests), keys(ic.Resources.Limits)), isGPUResource) {
		t.Errorf("the init container asks for a GPU: %+v", ic.Resources)
	}
	sc := ic.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Privileged != nil && *sc.Privileged ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("init container security context is not locked down: %+v", sc)
	}
	if !slices.ContainsFunc(ic.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "dcgm" && m.MountPath == dcgmDir && !m.ReadOnly }) {
		t.Errorf("init container mounts %+v, want dcgm writable at %s", ic.VolumeMounts, dcgmDir)
	}
	if vol < 0 || a.pod.Volumes[vol].EmptyDir == nil {
		t.Errorf("no emptyDir volume dcgm: %+v", a.pod.Volumes)
	}
	if mount < 0 || agentC.VolumeMounts[mount].MountPath != dcgmDir || !agentC.VolumeMounts[mount].ReadOnly {
		t.Errorf("agent mounts %+v, want dcgm read-only at %s", agentC.VolumeMounts, dcgmDir)
	}
	for _, c := range a.pod.Containers {
		if c.Name != "agent" && slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "dcgm" }) {
			t.Errorf("container %s mounts the dcgmi copy too", c.Name)
		}
	}
}

func keys(l corev1.ResourceList) []corev1.ResourceName {
	var out []corev1.ResourceName
	for k := range l {
		out = append(out, k)
	}
	return out
}

// TestValidationNeedsRemediation: the agent refuses a config with validation on and remediation
// off, on every node at once; the chart refuses to render it, saying why.
func TestValidationNeedsRemediation(t *testing.T) {
	requireHelm(t)
	_, err := Template(context.Background(), releaseWith("config.remediation.validation.enabled=true"))
	if err == nil || !strings.Contains(err.Error(), "config.remediation.validation.enabled needs config.remediation.enabled") {
		t.Errorf("rendering validation without remediation: %v, want a refusal naming both", err)
	}
}

// TestValidationValuesAreTheAgentsDefaults: values.yaml spells the validation's defaults out
// (the chart rewrites a dcgmi command, so it must know it): they must be the agent's own.
func TestValidationValuesAreTheAgentsDefaults(t *testing.T) {
	chart, err := Chart()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Config struct {
			Remediation struct {
				Validation struct {
					Enabled     bool     `json:"enabled"`
					Command     []string `json:"command"`
					Format      string   `json:"format"`
					Timeout     string   `json:"timeout"`
					AfterReboot bool     `json:"afterReboot"`
					Probation   string   `json:"probation"`
				} `json:"validation"`
			} `json:"remediation"`
		} `json:"config"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	v := values.Config.Remediation.Validation
	timeout, err := time.ParseDuration(v.Timeout)
	if err != nil {
		t.Fatalf("timeout %q: %v", v.Timeout, err)
	}
	if v.Enabled || !slices.Equal(v.Command, config.DefaultValidationCommand()) || v.Format != string(validation.FormatDCGM) ||
		timeout != config.DefaultValidationTimeout || !v.AfterReboot || v.Probation != "" {
		t.Errorf("values.yaml config.remediation.validation %+v: want off, and the agent's defaults: command %q, format %s, timeout %v, afterReboot, remediation's probation",
			v, config.DefaultValidationCommand(), validation.FormatDCGM, config.DefaultValidationTimeout)
	}
}

// TestGPUOperatorValidationValues: gpu-operator-values.yaml holds validation ready beside the
// GPU operator, off until the two switches: then the agent copies dcgmi from the operator's
// DCGM image and runs DCGM's level-2 diagnostic on its own node's host engine, read as DCGM's
// JSON, within a timeout.
func TestGPUOperatorValidationValues(t *testing.T) {
	requireHelm(t)
	values := []string{"deployments/helm/gpuhealth/gpu-operator-values.yaml"}
	off := renderAgent(t, Options{Release: "gpuhealth", Namespace: testNamespace, Values: values})
	if off.config.Remediation.Enabled || off.config.Remediation.Validation.Enabled || len(off.runOnceInits()) > 0 {
		t.Errorf("the GPU operator's values turn remediation or validation on by themselves:\n%s", off.raw)
	}
	o := Options{Release: "gpuhealth", Namespace: testNamespace, Values: values, Set: validationOn}
	if out, err := Lint(context.Background(), o); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	on := renderAgent(t, o)
	v := on.config.Remediation.Validation
	if !v.Enabled || v.Format != string(validation.FormatDCGM) || v.Timeout == nil || time.Duration(*v.Timeout) > time.Hour {
		t.Errorf("validation %+v: want on, format dcgm, a timeout of an hour at most", v)
	}
	cmd := v.Command
	if len(cmd) < 4 || !slices.Equal(cmd[:4], []string{dcgmDir + "/ld.so", "--library-path", dcgmDir + "/lib", dcgmDir + "/dcgmi"}) {
		t.Fatalf("command %q: want the copied dcgmi run by its own loader", cmd)
	}
	args := strings.Join(cmd[4:], " ")
	for _, want := range []string{"diag ", "-r 2", "-i gpu:{dcgmID}", "-j", "--host nvidia-dcgm.gpu-operator.svc:5555"} {
		if !strings.Contains(args, want) {
			t.Errorf("dcgmi %s: want %q", args, want)
		}
	}
	if len(on.runOnceInits()) != 1 || !strings.HasPrefix(on.runOnceInits()[0].Image, "nvcr.io/nvidia/cloud-native/dcgm:") {
		t.Errorf("init containers %+v, want dcgm-copy from the operator's DCGM image", on.runOnceInits())
	}
}

// TestDCGMCopyScript runs the dcgm-copy init container's script, as the chart renders it, on this
// machine: a dynamically linked program stands in for dcgmi. The copy must then run through its
// own loader with nothing from the host's library paths, as the agent runs it; a program that
// is not there must leave nothing behind and still let the agent's pod start.
func TestDCGMCopyScript(t *testing.T) {
	requireHelm(t)
	if runtime.GOOS != "linux" {
		t.Skip("the script runs in a Linux container")
	}
	for _, tool := range []string{"sh", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s here: %v", tool, err)
		}
	}
	a := renderAgent(t, releaseWith(append(slices.Clone(validationOn), "agent.validation.dcgmImage="+testDCGMImage)...))
	if len(a.runOnceInits()) != 1 {
		t.Fatalf("init containers %+v", a.runOnceInits())
	}
	script := a.runOnceInits()[0].Args[0]
	// A program that links a few libraries and answers --version stands in for dcgmi.
	stand, err := exec.LookPath("ls")
	if err != nil {
		t.Skipf("no ls here: %v", err)
	}
	run := func(t *testing.T, dcgmi string) (dest, out string) {
		t.Helper()
		dest = filepath.Join(t.TempDir(), "dcgm")
		if err := os.Mkdir(dest, 0o777); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(t.Context(), "sh", "-c", script)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DCGMI=" + dcgmi, "DEST=" + dest}
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the script failed (it must never keep the agent from starting): %v\n%s", err, b)
		}
		return dest, string(b)
	}

	t.Run("a dynamic program", func(t *testing.T) {
		dest, out := run(t, filepath.Base(stand))
		for _, f := range []string{"ld.so", "dcgmi", "lib/libc.so.6"} {
			if _, err := os.Stat(filepath.Join(dest, f)); err != nil {
				t.Errorf("%s not copied: %v\n%s", f, err, out)
			}
		}
		if _, err := os.Stat(filepath.Join(dest, "ldd.txt")); err == nil {
			t.Errorf("the script left its scratch file behind")
		}
		// As the agent runs it: the loader, its library path, no environment.
		cmd := exec.CommandContext(t.Context(), filepath.Join(dest, "ld.so"), "--library-path", filepath.Join(dest, "lib"), filepath.Join(dest, "dcgmi"), "--version")
		cmd.Env = []string{}
		b, err := cmd.CombinedOutput()
		if err != nil || len(b) == 0 {
			t.Fatalf("the copy does not run: %v\n%s\nscript said: %s", err, b, out)
		}
		// Every library it loads comes from the copy.
		list := exec.CommandContext(t.Context(), filepath.Join(dest, "ld.so"), "--library-path", filepath.Join(dest, "lib"), "--list", filepath.Join(dest, "dcgmi"))
		b, err = list.CombinedOutput()
		if err != nil {
			t.Fatalf("ld.so --list: %v\n%s", err, b)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			_, path, ok := strings.Cut(line, "=> ")
			if !ok {
				continue
			}
			if !strings.HasPrefix(path, dest+"/") {
				t.Errorf("the copy loads %s from outside it", strings.TrimSpace(line))
			}
		}
	})

	t.Run("no such program", func(t *testing.T) {
		dest, out := run(t, "no-such-dcgmi")
		entries, err := os.ReadDir(dest)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) > 0 {
			t.Errorf("a failed copy left %v behind", entries)
		}
		if !strings.Contains(out, "no-such-dcgmi not found") || !strings.Contains(out, "GPUValidationError") {
			t.Errorf("the script does not say what failed and what follows:\n%s", out)
		}
	})

	t.Run("a script, not a dynamic program", func(t *testing.T) {
		notELF := filepath.Join(t.TempDir(), "dcgmi")
		if err := os.WriteFile(notELF, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		dest, out := run(t, notELF)
		if entries, _ := os.ReadDir(dest); len(entries) > 0 {
			t.Errorf("a failed copy left %v behind\n%s", entries, out)
		}
	})
}

// fakeDCGMIEnv, when set (to the GPU's UUID), makes this test binary play dcgmi (TestMain):
// TestDCGMCopyRunsTheAgentsValidation copies the binary, a dynamically linked program, with the
// chart's script and runs it as the agent would. fakeDCGMILogEnv names a file that gets one line
// of arguments per call.
const (
	fakeDCGMIEnv    = "GPUHEALTH_TEST_FAKE_DCGMI"
	fakeDCGMILogEnv = "GPUHEALTH_TEST_FAKE_DCGMI_LOG"
	// fakeDCGMID is the GPU's id in the fake DCGM: not its index, so a diagnostic of the index
	// would be of another GPU.
	fakeDCGMID = 3
)

func TestMain(m *testing.M) {
	if uuid := os.Getenv(fakeDCGMIEnv); uuid != "" {
		os.Exit(fakeDCGMI(uuid, os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// fakeDCGMI answers `dcgmi discovery -l` with one GPU, uuid, as DCGM's id fakeDCGMID, and `dcgmi
// diag -i gpu:ID -j` of that id with the simulator's passing DCGM 4 document.
func fakeDCGMI(uuid string, args []string, stdout, stderr io.Writer) int {
	if log := os.Getenv(fakeDCGMILogEnv); log != "" {
		f, err := os.OpenFile(log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			_, _ = fmt.Fprintln(f, strings.Join(args, " "))
			_ = f.Close()
		}
	}
	dev := sim.DCGMDevice{Name: sim.DefaultModel, UUID: uuid, PCIBusID: "00000000:18:00.0", Serial: sim.DefaultSerial(sim.DefaultNode, 0), DeviceID: sim.PCIDeviceID}
	switch {
	case len(args) >= 2 && args[0] == "discovery" && args[1] == "-l":
		border := "+--------+----------------------------------------------------------------------+\n"
		_, _ = fmt.Fprintf(stdout, "1 GPU found.\n%s| GPU ID | Device Information |\n%s| %d      | Name: %s |\n|        | PCI Bus ID: %s |\n|        | Device UUID: %s |\n%s",
			border, border, fakeDCGMID, dev.Name, dev.PCIBusID, dev.UUID, border)
		return sim.DCGMExitOK
	case len(args) > 0 && args[0] == "diag":
		entity := ""
		for i, a := range args {
			if a == "-i" && i+1 < len(args) {
				entity = args[i+1]
			}
		}
		if entity != fmt.Sprintf("gpu:%d", fakeDCGMID) {
			_, _ = fmt.Fprintf(stderr, "fake dcgmi: a diagnostic of %q, not of the GPU (gpu:%d)\n", entity, fakeDCGMID)
			return sim.DCGMExitUsage
		}
		out, code := sim.DCGMDiag(sim.DCGMRun{Version: sim.DCGMVersion4, GPU: fakeDCGMID, Entities: entity, Level: 2, JSON: true,
			Device: dev, DriverVersion: sim.SimDriverVersion})
		_, _ = stdout.Write(out)
		return code
	}
	_, _ = fmt.Fprintf(stderr, "fake dcgmi: unexpected arguments %q\n", args)
	return sim.DCGMExitUsage
}

// TestDCGMCopyRunsTheAgentsValidation: the validation command the chart renders with
// agent.validation.dcgmImage, run by the agent's own runner (pkg/health/validation) on what the
// dcgm-copy script copied, reaches dcgmi through the copied loader for both of its calls (DCGM's
// discovery, which maps the GPU's UUID to DCGM's id, and the diagnostic of that id) and passes.
// This test binary stands in for dcgmi; with the GPU operator's values both calls name its host
// engine.
func TestDCGMCopyRunsTheAgentsValidation(t *testing.T) {
	requireHelm(t)
	if runtime.GOOS != "linux" {
		t.Skip("the copy runs in a Linux container")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), "ldd", self).CombinedOutput(); err != nil {
		t.Skipf("this test binary cannot stand in for dcgmi (ldd: %v: %s)", err, out)
	}
	const uuid = "GPU-6b1c9fe2-0000-4000-8000-000000000003"
	for _, tc := range []struct {
		name   string
		values []string
		host   string
	}{
		{name: "defaults"},
		{name: "GPU operator", values: []string{"deployments/helm/gpuhealth/gpu-operator-values.yaml"}, host: "--host nvidia-dcgm.gpu-operator.svc:5555"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := releaseWith(append(slices.Clone(validationOn), "agent.validation.dcgmImage="+testDCGMImage)...)
			o.Values = tc.values
			a := renderAgent(t, o)
			dest := filepath.Join(t.TempDir(), "dcgm")
			if err := os.Mkdir(dest, 0o777); err != nil {
				t.Fatal(err)
			}
			script := exec.CommandContext(t.Context(), "sh", "-c", a.runOnceInits()[0].Args[0])
			script.Env = []string{"PATH=" + os.Getenv("PATH"), "DCGMI=" + self, "DEST=" + dest}
			if out, err := script.CombinedOutput(); err != nil {
				t.Fatalf("copy: %v\n%s", err, out)
			}
			v := a.config.Remediation.WithDefaults().Validation
			format, err := validation.ParseFormat(v.Format)
			if err != nil {
				t.Fatal(err)
			}
			// The copy as the agent sees it, at its mount path.
			var argv []string
			for _, arg := range v.Command {
				argv = append(argv, strings.Replace(arg, dcgmDir, dest, 1))
			}
			log := filepath.Join(t.TempDir(), "calls")
			cmd := validation.Command{Argv: argv, Format: format, Timeout: time.Minute, Env: []string{fakeDCGMIEnv + "=" + uuid, fakeDCGMILogEnv + "=" + log}}
			verdict := cmd.Run(t.Context(), health.Device{UUID: uuid, Index: 0, PCIBusID: "00000000:18:00.0"}, "n1")
			calls, _ := os.ReadFile(log)
			if verdict.Result != validation.Passed {
				t.Fatalf("%q: verdict %+v, want a pass\ndcgmi calls:\n%s", argv, verdict, calls)
			}
			for _, call := range strings.Split(strings.TrimSpace(string(calls)), "\n") {
				if !strings.Contains(call, tc.host) {
					t.Errorf("dcgmi %s: want %q", call, tc.host)
				}
			}
		})
	}
}
