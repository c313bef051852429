//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// TestKernelLogInTheAgentContainer answers, on a real runtime (containerd and runc on a real
// kubelet node), which container may read the host's kernel log: a pod with a container's
// security context runs `gpuhealth probe --kernel-log` from the image. The agent's container as
// the chart renders it, given the host's /dev/kmsg and CAP_SYSLOG (what earlier charts did), is
// refused by the runtime's device rules, as docs/kernel-log.md says, with the probe's hint
// naming the way out; the chart's kmsg-relay container (privileged, nothing mounted: a
// privileged container has the host's devices) reads the whole log.
func TestKernelLogInTheAgentContainer(t *testing.T) {
	skipWithoutContainers(t)
	t.Parallel()
	c, n, image := startContainerdNode(t)
	ctx := t.Context()
	const ns = "default"
	chart := renderedAgentContainer(t)
	withSyslog := chart.agent.SecurityContext.DeepCopy()
	withSyslog.Capabilities.Add = append(withSyslog.Capabilities.Add, "SYSLOG")
	hostKmsg := corev1.Volume{Name: "kmsg", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: kmsg.DevKmsg, Type: ptr.To(corev1.HostPathCharDev)}}}
	for _, tc := range []struct {
		name         string
		sc           *corev1.SecurityContext
		volumes      []corev1.Volume
		mounts       []corev1.VolumeMount
		wantReadable bool
	}{
		{"the agent's container with /dev/kmsg and CAP_SYSLOG", withSyslog, []corev1.Volume{hostKmsg},
			[]corev1.VolumeMount{{Name: "kmsg", MountPath: kmsg.DevKmsg, ReadOnly: true}}, false},
		{"the chart's kmsg-relay container", chart.relay.SecurityContext, nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.sc == nil || chart.relay.SecurityContext == nil {
				t.Fatalf("the chart renders no security context: agent %+v, relay %+v", chart.agent.SecurityContext, chart.relay.SecurityContext)
			}
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "kmsg-probe-" + fmt.Sprint(tc.wantReadable), Namespace: ns},
				Spec: corev1.PodSpec{
					NodeName:                     n.Name,
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					Containers: []corev1.Container{{
						Name: "probe", Image: image, ImagePullPolicy: corev1.PullNever,
						Command:         []string{"/gpuhealth", "probe", "--kernel-log", "--output", "json"},
						SecurityContext: tc.sc,
						VolumeMounts:    tc.mounts,
					}},
					Volumes: tc.volumes,
				},
			}
			created, err := c.Admin().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var phase corev1.PodPhase
			eventuallyWithin(t, 2*pollTimeout, "the probe pod to finish", func(ctx context.Context) (bool, string, error) {
				p, err := c.Admin().CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					return false, "", err
				}
				phase = p.Status.Phase
				return phase == corev1.PodSucceeded || phase == corev1.PodFailed, string(phase), nil
			})
			// The report is the probe's stdout; its error line goes to stderr, which the runtime
			// may log before, after or between the report's lines, so read stdout alone from
			// the container's CRI log.
			logs := containerStdout(t, n, ns, created.Name, created.UID, "probe")
			var rep kmsg.ProbeReport
			if err := json.Unmarshal(logs, &rep); err != nil {
				t.Fatalf("probe output is not a report: %v\n%s", err, logs)
			}
			t.Logf("%s: phase %s, readable %v, records %d, error %q", tc.name, phase, rep.Readable, rep.Records, rep.Error)
			if rep.Readable != tc.wantReadable {
				t.Fatalf("readable = %v, want %v; security context %+v\n%s", rep.Readable, tc.wantReadable, tc.sc, logs)
			}
			if tc.wantReadable {
				if phase != corev1.PodSucceeded || rep.Records == 0 {
					t.Errorf("phase %s with %d records, want Succeeded with the host's log", phase, rep.Records)
				}
				return
			}
			if phase != corev1.PodFailed || !strings.Contains(rep.Error, "operation not permitted") || !strings.Contains(rep.Hint, "kmsg-relay") {
				t.Errorf("phase %s, error %q, hint %q: want Failed, EPERM, and the hint to name the kmsg-relay container", phase, rep.Error, rep.Hint)
			}
		})
	}
}

// renderedAgent is what the chart renders for the agent container and the kmsg relay.
type renderedAgent struct {
	agent, relay corev1.Container
}

// renderedAgentContainer renders the chart with ci/local-values.yaml and the NVML backend (which
// reads the node's kernel log), and returns its agent and kmsg-relay containers.
func renderedAgentContainer(t *testing.T) renderedAgent {
	t.Helper()
	manifest, err := helm.Template(t.Context(), helm.Options{
		Release: "gpuhealth", Namespace: "gpuhealth-system",
		Values: []string{"deployments/helm/gpuhealth/ci/local-values.yaml"}, Set: []string{"agent.backend=nvml"},
	})
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, manifest)
	}
	objs, err := helm.Decode(manifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" || o.GetLabels()["app.kubernetes.io/component"] != "agent" {
			continue
		}
		var ds appsv1.DaemonSet
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
			t.Fatal(err)
		}
		var out renderedAgent
		for _, ctr := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
			switch ctr.Name {
			case "agent":
				out.agent = ctr
			case "kmsg-relay":
				out.relay = ctr
			}
		}
		if out.agent.Name == "" || out.relay.Name == "" {
			t.Fatalf("the agent DaemonSet lacks the agent or the kmsg-relay container: %+v", ds.Spec.Template.Spec)
		}
		return out
	}
	t.Fatal("the chart renders no agent DaemonSet")
	return renderedAgent{}
}

// containerStdout returns what the container wrote to stdout, from the kubelet's CRI log file of
// its first run on node n (lines "TIME STREAM P|F TEXT"; P marks a line the runtime split).
func containerStdout(t *testing.T, n *controlplane.KubeletNode, ns, pod string, uid types.UID, container string) []byte {
	t.Helper()
	path := filepath.Join(n.Dir, "pod-logs", ns+"_"+pod+"_"+string(uid), container, "0.log")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the container's log: %v", err)
	}
	var out bytes.Buffer
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		fields := strings.SplitN(line, " ", 4)
		if len(fields) < 3 || fields[1] != "stdout" {
			continue
		}
		if len(fields) == 4 {
			out.WriteString(fields[3])
		}
		if fields[2] == "F" {
			out.WriteByte('\n')
		}
	}
	return out.Bytes()
}
