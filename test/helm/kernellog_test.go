package helm

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

const (
	relayName       = "kmsg-relay"
	relaySocket     = "/run/gpuhealth-kmsg/relay.sock"
	tokenMountPath  = "/var/run/secrets/kubernetes.io/serviceaccount"
	tokenVolumeName = "kube-api-access"
)

// relayContainer returns the pod's kmsg-relay init container, or nil.
func relayContainer(pod corev1.PodSpec) *corev1.Container {
	for i, c := range pod.InitContainers {
		if c.Name == relayName {
			return &pod.InitContainers[i]
		}
	}
	return nil
}

func mounts(c corev1.Container, path string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(path, m.MountPath) })
}

// TestAgentKernelLog: with the kernel log on (the default) and the NVML backend, a kmsg-relay
// sidecar reads the host's kernel log, privileged and with nothing else: no API token, no port,
// no host path. It is the only privileged container (but for NVML's mode hostMounts), the agent
// and the device plugin read its socket unprivileged and without CAP_SYSLOG, and the
// HealthConfig names the socket. Off, or with the simulator, there is no relay.
func TestAgentKernelLog(t *testing.T) {
	requireHelm(t)
	for _, tc := range []struct {
		name      string
		set       []string
		wantRelay bool
		// agentPrivileged: NVML's mode hostMounts runs the agent privileged, for the host's
		// device nodes; nothing of the kernel log does.
		agentPrivileged bool
		relayArgs       []string
	}{
		{name: "default", wantRelay: true},
		{name: "with the device plugin", set: []string{"agent.devicePlugin.enabled=true"}, wantRelay: true},
		{name: "off", set: []string{"config.kernelLog.enabled=false"}},
		{name: "the simulator reads no kernel log of its node", set: []string{"agent.backend=sim", "agent.sim.scenario=scenario"}},
		{name: "hostMounts", set: []string{"agent.nvml.mode=hostMounts"}, wantRelay: true, agentPrivileged: true},
		{name: "another device", set: []string{"config.kernelLog.path=/host/dev/kmsg"}, wantRelay: true, relayArgs: []string{"--kernel-log-path=/host/dev/kmsg"}},
		{name: "with dcgm-copy", set: append(slices.Clone(validationOn), "agent.validation.dcgmImage="+testDCGMImage), wantRelay: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := renderAgent(t, releaseWith(tc.set...))
			pod := a.pod
			if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				t.Error("the token is mounted pod-wide, into every container")
			}
			relay := relayContainer(pod)
			k := a.config.KernelLogSection()
			if !tc.wantRelay {
				if relay != nil || slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == relayName }) || k.RelaySocket != "" {
					t.Errorf("a relay nobody reads: container %v, HealthConfig relaySocket %q", relay != nil, k.RelaySocket)
				}
			} else {
				checkRelay(t, pod, *relay, tc.relayArgs)
				if k.RelaySocket != relaySocket || k.Path != "" || !*k.Enabled {
					t.Errorf("HealthConfig kernelLog %+v, want on, read from %s", k, relaySocket)
				}
			}
			for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
				privileged := c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
				want := c.Name == relayName || tc.agentPrivileged && (c.Name == "agent" || c.Name == "device-plugin")
				if privileged != want {
					t.Errorf("container %s privileged %v, want %v", c.Name, privileged, want)
				}
				if c.SecurityContext != nil && c.SecurityContext.Capabilities != nil && slices.Contains(c.SecurityContext.Capabilities.Add, "SYSLOG") {
					t.Errorf("container %s adds CAP_SYSLOG", c.Name)
				}
				api := c.Name == "agent" || c.Name == "device-plugin"
				if mounts(c, tokenMountPath+"/token") != api {
					t.Errorf("container %s has the API token mounted: %v, want %v", c.Name, !api, api)
				}
				if api && mounts(c, relaySocket) != tc.wantRelay {
					t.Errorf("container %s mounts the relay's socket: %v, want %v", c.Name, !tc.wantRelay, tc.wantRelay)
				}
			}
			for _, v := range pod.Volumes {
				if v.HostPath != nil && v.HostPath.Path == "/dev/kmsg" {
					t.Errorf("volume %s mounts the host's /dev/kmsg", v.Name)
				}
			}
		})
	}
	if _, err := Template(t.Context(), releaseWith("agent.kernelLog.privileged=true")); err == nil || !strings.Contains(err.Error(), "agent.kernelLog.privileged was removed") {
		t.Errorf("the removed agent.kernelLog.privileged rendered (err %v), want a failure saying so", err)
	}
}

// checkRelay checks the kmsg-relay sidecar: /gpuhealth kmsg-relay on the socket, a native
// sidecar, privileged but read-only, and with nothing but its socket's emptyDir.
func checkRelay(t *testing.T, pod corev1.PodSpec, relay corev1.Container, extraArgs []string) {
	t.Helper()
	if relay.RestartPolicy == nil || *relay.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("restartPolicy %v, want Always: a sidecar that starts before the agent", relay.RestartPolicy)
	}
	wantArgs := append([]string{"kmsg-relay", "--socket=" + relaySocket}, extraArgs...)
	if !slices.Equal(relay.Command, []string{"/gpuhealth"}) || !slices.Equal(relay.Args[:len(wantArgs)], wantArgs) {
		t.Errorf("relay runs %v %v, want /gpuhealth %v", relay.Command, relay.Args, wantArgs)
	}
	sc := relay.SecurityContext
	if sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("relay security context %+v, want privileged (the device rule), root to open the log, read-only root", sc)
	}
	if len(relay.Ports) > 0 || len(relay.EnvFrom) > 0 {
		t.Errorf("relay ports %v, envFrom %v: want none", relay.Ports, relay.EnvFrom)
	}
	if len(relay.VolumeMounts) != 1 || relay.VolumeMounts[0].Name != relayName || relay.VolumeMounts[0].MountPath != "/run/gpuhealth-kmsg" {
		t.Errorf("relay mounts %+v, want its socket's directory alone", relay.VolumeMounts)
	}
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == relayName })
	if i < 0 || pod.Volumes[i].EmptyDir == nil {
		t.Errorf("no emptyDir %s for the socket: %+v", relayName, pod.Volumes)
	}
	// The agent's token, mounted only where asked for: the projected volume holds exactly what
	// the ServiceAccount admission would have mounted.
	i = slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == tokenVolumeName })
	if i < 0 || pod.Volumes[i].Projected == nil || len(pod.Volumes[i].Projected.Sources) != 3 {
		t.Fatalf("no projected %s volume: %+v", tokenVolumeName, pod.Volumes)
	}
	src := pod.Volumes[i].Projected.Sources
	if src[0].ServiceAccountToken == nil || src[0].ServiceAccountToken.Path != "token" || src[1].ConfigMap == nil ||
		src[1].ConfigMap.Name != "kube-root-ca.crt" || src[2].DownwardAPI == nil || src[2].DownwardAPI.Items[0].Path != "namespace" {
		t.Errorf("%s sources %+v, want token, kube-root-ca.crt's ca.crt and the namespace", tokenVolumeName, src)
	}
}
