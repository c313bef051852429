package main

// The story's sections after the set-up, each told from the state it has just read.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// faults tells the faults of demo-node-0 as the agent reports them.
func (d *demo) faults() error {
	ctx, st, admin, status := d.ctx, d.st, d.admin, d.status
	st.heading("Faults on " + nodes[0])
	st.say("the scenario makes GPU 3 fall off the bus (XID 79) and GPU 5 overheat (97 °C), then cools GPU 5 down")
	if err := waitFor(ctx, "GPU 3 and GPU 5 of "+nodes[0]+" to be reported Unhealthy", func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, nodes[0], metav1.GetOptions{})
		return err == nil && n.Annotations[gpuhealthv1.UnhealthyIDsKey] == "3,5", err
	}); err != nil {
		return err
	}
	st.say("$ gpuhealth status --problems")
	if err := status("--problems"); err != nil {
		return err
	}
	if err := waitFor(ctx, "the kubelet of "+nodes[0]+" to count 6 healthy GPUs", func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, nodes[0], metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		allocatable := n.Status.Allocatable[scheduling.ResourceGPU]
		return allocatable.Value() == gpusPerNode-2, nil
	}); err != nil {
		return err
	}
	if err := sayAllocatable(ctx, st, admin); err != nil {
		return err
	}

	return nil
}

// repair tells GPU 7's repair, and GPU 6's, which its validation keeps out.
func (d *demo) repair() error {
	ctx, st, admin, start, status, onDriver, devicePlugins := d.ctx, d.st, d.admin, d.start, d.status, d.onDriver, d.devicePlugins
	st.heading(fmt.Sprintf("A GPU reset repairs GPU %d of %s", repairGPU, repairNode))
	st.say("the agent of %s sees a double-bit ECC error (XID 48) on GPUs %d and %d: a GPU reset clears it, and each GPU is tested (validated) before it goes back", repairNode, repairGPU, latentGPU)
	// GPU 7's repair took at least one reset (two on the driver when the first was refused).
	attempts := 1
	if onDriver {
		// gpuhealth's own device plugin holds the node's GPUs open, and the driver refuses a
		// reset then, as NVIDIA's does (issue #29 has the agent pause such holders itself).
		if err := waitFor(ctx, "the first reset to be refused", func() (bool, error) {
			events, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + repairNode})
			if err != nil {
				return false, err
			}
			for _, e := range events.Items {
				if e.Reason == "GPURemediationAttemptFailed" {
					msg := e.Message
					if i := strings.LastIndex(msg, "exit status 1: "); i >= 0 { // the driver's answer, not the whole command
						gpu, _, _ := strings.Cut(msg, " (")
						msg = fmt.Sprintf("%s: %s", gpu, msg[i+len("exit status 1: "):])
					}
					st.say("event %-28s %s", e.Reason, msg)
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return err
		}
		st.say("the driver refused the reset: the device plugin of %s holds the GPUs; the operator stops it", repairNode)
		dp := d.started["device-plugin-"+repairNode]
		_ = dp.Process.Signal(syscall.SIGTERM)
		_ = dp.Wait()
		d.procs = slices.DeleteFunc(d.procs, func(c *exec.Cmd) bool { return c == dp })
	}
	if err := waitFor(ctx, "the repair of GPU 7", func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, repairNode, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		r, err := gpuhealthv1.ParseRemediation(n.Annotations[gpuhealthv1.RemediationKey])
		uuid := sim.GPUUUID(repairNode, repairGPU)
		// The first reset may be refused (on the driver, while the device plugin holds the GPUs).
		return err == nil && r[uuid].Phase == "" && r[uuid].Attempts >= attempts, err
	}); err != nil {
		return err
	}
	if onDriver {
		// Its checkpoint still has the XID 48 a reset clears: a reset while it was stopped is
		// invisible to it (NVML keeps no record of one), so the operator starts it afresh.
		st.say("GPU 7 is reset; the operator starts the device plugin of %s again, without the checkpoint from before the reset", repairNode)
		args := slices.Clone(devicePlugins[repairNode])
		args[len(args)-1] += ".after-reset"
		if err := start("device-plugin-"+repairNode, args...); err != nil {
			return err
		}
		if err := waitFor(ctx, "the kubelet of "+repairNode+" to count 8 healthy GPUs again", func() (bool, error) {
			n, err := admin.CoreV1().Nodes().Get(ctx, repairNode, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			allocatable := n.Status.Allocatable[scheduling.ResourceGPU]
			return allocatable.Value() == gpusPerNode, nil
		}); err != nil {
			return err
		}
	}
	// GPU 6 was reset beside it, and a passive probation would have given it back: its
	// validation, an active test of that GPU alone, finds the fault the reset did not cure.
	latentUUID := sim.GPUUUID(repairNode, latentGPU)
	if err := waitFor(ctx, fmt.Sprintf("GPU %d's validation", latentGPU), func() (bool, error) {
		events, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + repairNode})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
			return e.Reason == "GPUValidationFailed" && strings.Contains(e.Message, latentUUID)
		}), nil
	}); err != nil {
		return err
	}
	events, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + repairNode})
	if err != nil {
		return err
	}
	slices.SortFunc(events.Items, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	for _, e := range events.Items {
		if strings.HasPrefix(e.Reason, "GPURemediation") || strings.HasPrefix(e.Reason, "GPUValidation") {
			st.say("event %-28s %s", e.Reason, e.Message)
		}
	}
	st.say("GPU %d of %s was reset too and looked healthy, but its validation (DCGM's diagnostic of that GPU alone) failed: it stays out of service, where a passive probation would have given it back", latentGPU, repairNode)
	st.say("$ gpuhealth status --node %s", repairNode)
	if err := status("--node", repairNode); err != nil {
		return err
	}

	return nil
}

// drain tells an operator's drain.
func (d *demo) drain() error {
	ctx, st, admin, bin, kubeconfig, status := d.ctx, d.st, d.admin, d.bin, d.kubeconfig, d.status
	st.heading("An operator drains GPU 2 of " + nodes[1])
	cmd := exec.CommandContext(ctx, bin, "drain", nodes[1], "2", "--reason", "fan noise, RMA ticket 4711", "--kubeconfig", kubeconfig)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return err
	}
	if err := waitFor(ctx, "the drain to reach the node's gpu-unhealthy-ids", func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, nodes[1], metav1.GetOptions{})
		return err == nil && n.Annotations[gpuhealthv1.UnhealthyIDsKey] == "2", err
	}); err != nil {
		return err
	}
	st.say("$ gpuhealth status --problems -o wide")
	if err := status("--problems", "-o", "wide"); err != nil {
		return err
	}

	return nil
}

// work submits the pods and tells where each went.
func (d *demo) work() error {
	ctx, st, admin := d.ctx, d.st, d.admin
	st.heading("Work arrives")
	if err := submitWork(ctx, st, admin); err != nil {
		return err
	}
	if err := sayRunning(ctx, st, admin); err != nil {
		return err
	}

	return nil
}

// coolDown tells GPU 5's return once it cooled down.
func (d *demo) coolDown() error {
	ctx, st, admin, status := d.ctx, d.st, d.admin, d.status
	// GPU 5 cools down at the scenario's 25 s: the story says whether that happened already.
	recovered := func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, nodes[0], metav1.GetOptions{})
		return err == nil && n.Annotations[gpuhealthv1.UnhealthyIDsKey] == "3", err
	}
	if back, err := recovered(); err != nil {
		return err
	} else if back {
		st.heading("GPU 5 of " + nodes[0] + " has cooled down")
		st.say("GPU 5 is back already: Healthy again after three clean samples below its slowdown temperature")
	} else {
		st.heading("GPU 5 of " + nodes[0] + " cools down")
		if err := waitFor(ctx, "GPU 5 to recover after three clean samples", recovered); err != nil {
			return err
		}
	}
	st.say("$ gpuhealth status --problems")
	if err := status("--problems"); err != nil {
		return err
	}
	st.say("GPU 3 stays out until the node reboots; GPU 2 of %s until `gpuhealth undrain %s 2`", nodes[1], nodes[1])
	return nil
}

// taintedDevices names the DRA devices of node that gpuhealth's DeviceTaintRules keep work off
// now ("gpu-3, gpu-5"; "none" when there are none).
func taintedDevices(ctx context.Context, admin kubernetes.Interface, node string) (string, error) {
	rules, err := admin.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: devicetaint.NodeLabel + "=" + node})
	if err != nil {
		return "", err
	}
	var names []string
	for _, r := range rules.Items {
		if sel := r.Spec.DeviceSelector; sel != nil && sel.Device != nil && r.Spec.Taint.Effect != resourcev1.DeviceTaintEffectNone {
			names = append(names, *sel.Device)
		}
	}
	if len(names) == 0 {
		return "none", nil
	}
	slices.Sort(names)
	return strings.Join(names, ", "), nil
}

// driverLead is how long after its start a node's simulated driver plays its scenario's first
// instant: the agent and the device plugin watch the GPUs by then.
const driverLead = 5 * time.Second

// atField is a scenario event's `at`.
var atField = regexp.MustCompile(`\bat:\s*([0-9][0-9a-z.]*)`)
