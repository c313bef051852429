//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestDRAFixtures runs the agent (sim backend) against the ResourceSlices NVIDIA's DRA driver
// publishes today (test/controlplane's NVIDIA fixtures, docs/dra-devices.md), with the real
// kube-apiserver and kube-scheduler: for each kind of device, a claim that can only land on a
// sick GPU's device stays unschedulable while the same claim for a healthy GPU allocates.
func TestDRAFixtures(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableControllerManager: true})
	ctx := t.Context()
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const ns = "drafix"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	kubeconfig := agentKubeconfig(t, c)

	t.Run("whole GPUs named by minor, and static MIG", func(t *testing.T) {
		t.Parallel()
		const node = "fix-static"
		mig := map[int]int{2: 2, 6: 1}
		gpus := simNVIDIAGPUs(t, node, 8, mig)
		gpus[2].MIG = []controlplane.NVIDIAMIGDevice{{UUID: sim.MIGUUID(node, 2, 1), Profile: "3g.40gb"}, {UUID: sim.MIGUUID(node, 2, 2), Profile: "3g.40gb", PlacementStart: 4}}
		gpus[6].MIG = []controlplane.NVIDIAMIGDevice{{UUID: sim.MIGUUID(node, 6, 1), Profile: "7g.80gb"}}
		slice, err := controlplane.NVIDIAResourceSlice(node, gpus...)
		if err != nil {
			t.Fatal(err)
		}
		fixtureNode(t, c, node, slice)
		// GPU 3 falls off the bus; one MIG instance of GPU 2 has an uncontained ECC error; GPU 6,
		// all of it one static MIG device, falls off the bus too.
		startFixtureAgent(t, kubeconfig, node, 8, mig, fmt.Sprintf(`events:
  - {at: 1s, gpu: 3, xid: 79}
  - {at: 1s, gpu: %q, xid: 95}
  - {at: 1s, gpu: 6, xid: 79}
`, sim.MIGUUID(node, 2, 1)))
		mig21, mig22 := migName(gpus[2], "3g.40gb", 0), migName(gpus[2], "3g.40gb", 4)
		waitRuleDevices(t, c, node, controlplane.NVIDIAGPUDeviceName(gpus[3].Minor), mig21, migName(gpus[6], "7g.80gb", 0))

		sickAndHealthy(t, c, ns, node, []claimCase{
			{"static-gpu3", uuidIs(gpus[3].UUID), "", controlplane.NVIDIAGPUDeviceName(gpus[3].Minor)},
			{"static-mig21", uuidIs(sim.MIGUUID(node, 2, 1)), "", mig21},
			{"static-gpu6-mig", uuidIs(sim.MIGUUID(node, 6, 1)), "", migName(gpus[6], "7g.80gb", 0)},
			{"static-gpu5", uuidIs(gpus[5].UUID), controlplane.NVIDIAGPUDeviceName(gpus[5].Minor), ""},
			{"static-mig22", uuidIs(sim.MIGUUID(node, 2, 2)), mig22, ""},
		})
	})

	t.Run("passthrough: the VFIO device of a sick GPU", func(t *testing.T) {
		t.Parallel()
		const node = "fix-vfio"
		gpus := simNVIDIAGPUs(t, node, 8, nil)
		slice, err := controlplane.NVIDIAPassthroughResourceSlice(node, gpus...)
		if err != nil {
			t.Fatal(err)
		}
		fixtureNode(t, c, node, slice)
		startFixtureAgent(t, kubeconfig, node, 8, nil, "events:\n  - {at: 1s, gpu: 4, xid: 79}\n")
		// The simulator's PCI addresses grow with the index: the i-th GPU is gpu-vfio-i.
		waitRuleDevices(t, c, node, controlplane.NVIDIAGPUDeviceName(gpus[4].Minor), controlplane.NVIDIAVFIODeviceName(4))

		sickAndHealthy(t, c, ns, node, []claimCase{
			{"vfio-gpu4", vfioAt(gpus[4].PCIBusID), "", controlplane.NVIDIAVFIODeviceName(4)},
			{"vfio-gpu1", vfioAt(gpus[1].PCIBusID), controlplane.NVIDIAVFIODeviceName(1), ""},
		})
	})

	t.Run("dynamic MIG in split slices: every partition of a sick GPU", func(t *testing.T) {
		t.Parallel()
		const node = "fix-dynmig"
		gpus := simNVIDIAGPUs(t, node, 8, nil)
		fixtureNode(t, c, node, controlplane.NVIDIADynamicMIGResourceSlices(node, gpus...)...)
		startFixtureAgent(t, kubeconfig, node, 8, nil, "events:\n  - {at: 1s, gpu: 1, xid: 79}\n")
		want := []string{controlplane.NVIDIAGPUDeviceName(gpus[1].Minor)}
		for _, p := range controlplane.H100MIGProfiles() {
			for _, start := range p.Starts {
				want = append(want, controlplane.NVIDIAMIGDeviceName(gpus[1].Minor, p, start))
			}
		}
		waitRuleDevices(t, c, node, want...)

		prefix := func(g controlplane.NVIDIAGPU) string {
			return fmt.Sprintf("gpu-%d-mig-1g10gb-19-", g.Minor)
		}
		sickAndHealthy(t, c, ns, node, []claimCase{
			{"dynmig-gpu1", partitionOf(gpus[1].UUID, "1g.10gb"), "", prefix(gpus[1]) + "*"},
			{"dynmig-gpu0", partitionOf(gpus[0].UUID, "1g.10gb"), prefix(gpus[0]) + "*", ""},
		})
	})
}

// simNVIDIAGPUs describes the simulator's GPUs of node as NVIDIA's driver would: same UUIDs and
// PCI addresses (in the standard attribute's form), devices named by minor numbers that differ
// from the index.
func simNVIDIAGPUs(t *testing.T, node string, count int, mig map[int]int) []controlplane.NVIDIAGPU {
	t.Helper()
	sc := &sim.Scenario{Node: node, GPUCount: count, Model: sim.DefaultModel, MIGInstances: mig}
	minors := controlplane.HGXH100Minors()
	var gpus []controlplane.NVIDIAGPU
	for _, d := range sc.Devices() {
		if d.MIG != nil {
			continue
		}
		bus, err := dra.NormalizePCIBusID(d.PCIBusID)
		if err != nil {
			t.Fatal(err)
		}
		gpus = append(gpus, controlplane.NVIDIAGPU{UUID: d.UUID, Minor: minors[d.Index%len(minors)] + len(minors)*(d.Index/len(minors)), PCIBusID: bus})
	}
	return gpus
}

func migName(g controlplane.NVIDIAGPU, profile string, start int) string {
	p, _ := controlplane.H100MIGProfile(profile)
	return controlplane.NVIDIAMIGDeviceName(g.Minor, p, start)
}

// fixtureNode creates a Ready node with the given slices.
func fixtureNode(t *testing.T, c *controlplane.Cluster, node string, slices ...*resourcev1.ResourceSlice) {
	t.Helper()
	if _, err := c.CreateReadyNode(t.Context(), node, nil); err != nil {
		t.Fatal(err)
	}
	for _, s := range slices {
		if _, err := c.Admin().ResourceV1().ResourceSlices().Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ResourceSlice %s: %v", s.Name, err)
		}
	}
}

// waitRuleDevices waits until the node's DeviceTaintRules select exactly devices, NoSchedule.
func waitRuleDevices(t *testing.T, c *controlplane.Cluster, node string, devices ...string) {
	t.Helper()
	want := slices.Sorted(slices.Values(devices))
	eventually(t, "rules for "+strings.Join(want, ", "), func(ctx context.Context) (bool, string, error) {
		rs, err := rules(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		var got []string
		for _, r := range rs {
			if r.Spec.Taint.Effect != resourcev1.DeviceTaintEffectNoSchedule {
				return false, fmt.Sprint(ruleNames(rs)), nil
			}
			got = append(got, *r.Spec.DeviceSelector.Device)
		}
		slices.Sort(got)
		return slices.Equal(got, want), fmt.Sprint(got), nil
	})
}

// claimCase is a claim for one device picked by a CEL expression; want is the device it must
// get ("" for none: the pod stays unschedulable; a trailing * matches a prefix). For a claim
// that gets none, tolerated is the device the same claim gets once it tolerates gpuhealth's
// taint: the proof that the taint, and nothing else, keeps it off.
type claimCase struct{ name, cel, want, tolerated string }

func uuidIs(uuid string) string {
	return fmt.Sprintf(`device.attributes[%q].uuid == %q`, controlplane.GPUDriver, uuid)
}

func vfioAt(pciBusID string) string {
	return fmt.Sprintf(`device.attributes[%q].type == "vfio" && device.attributes["resource.kubernetes.io"].pciBusID == %q`, controlplane.GPUDriver, pciBusID)
}

func partitionOf(parent, profile string) string {
	return fmt.Sprintf(`device.attributes[%[1]q].type == "mig" && device.attributes[%[1]q].parentUUID == %[2]q && device.attributes[%[1]q].profile == %[3]q`,
		controlplane.GPUDriver, parent, profile)
}

// sickAndHealthy creates a pod with a claim per case on node and checks what each got; then,
// for each claim that got none, the same claim tolerating the taint.
func sickAndHealthy(t *testing.T, c *controlplane.Cluster, ns, node string, cases []claimCase) {
	t.Helper()
	for _, cc := range cases {
		podWithClaim(t, c, celClaim(ns, cc.name, cc.cel, false), node)
	}
	for _, cc := range cases {
		if cc.want == "" {
			waitUnschedulable(t, c, ns, cc.name)
			if dev, err := allocatedDevice(t.Context(), c, ns, cc.name); err != nil || dev != "" {
				t.Errorf("%s: device %q, err %v; want none", cc.name, dev, err)
			}
			continue
		}
		waitDevice(t, c, ns, cc.name, cc.want)
	}
	for _, cc := range cases {
		if cc.want == "" {
			podWithClaim(t, c, celClaim(ns, cc.name+"-tolerant", cc.cel, true), node)
			waitDevice(t, c, ns, cc.name+"-tolerant", cc.tolerated)
		}
	}
}

// celClaim is a claim for one device matching cel, tolerating gpuhealth's XID taints if asked.
func celClaim(ns, name, cel string, tolerate bool) *resourcev1.ResourceClaim {
	claim := controlplane.GPUClaim(ns, name)
	req := claim.Spec.Devices.Requests[0].Exactly
	req.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: cel}}}
	if tolerate {
		req.Tolerations = []resourcev1.DeviceToleration{{Key: "gpuhealth.dev/xid", Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoSchedule}}
	}
	return claim
}

// waitDevice waits until the claim is allocated want (a trailing * matches a prefix).
func waitDevice(t *testing.T, c *controlplane.Cluster, ns, name, want string) {
	t.Helper()
	eventually(t, "claim "+name+" allocated "+want, func(ctx context.Context) (bool, string, error) {
		dev, err := allocatedDevice(ctx, c, ns, name)
		prefix, isPrefix := strings.CutSuffix(want, "*")
		return dev == want || isPrefix && strings.HasPrefix(dev, prefix), "device " + dev, err
	})
}

// startFixtureAgent is startAgent with MIG instances in the simulator (gpus.migInstances).
func startFixtureAgent(t *testing.T, kubeconfig, node string, count int, mig map[int]int, events string) *agentProcess {
	t.Helper()
	var instances []string
	for _, i := range slices.Sorted(maps.Keys(mig)) {
		instances = append(instances, fmt.Sprintf("%q: %d", strconv.Itoa(i), mig[i]))
	}
	return startAgent(t, agentSetup{node: node, gpus: count, kubeconfig: kubeconfig,
		checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), scenario: events,
		gpusExtra: ", migInstances: {" + strings.Join(instances, ", ") + "}"})
}
