package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// clearPoll is how often `clear --wait` reads the Node and its Events.
const clearPoll = 500 * time.Millisecond

func newClearCommand() *cobra.Command {
	var f requestFlags
	cmd := &cobra.Command{
		Use:   "clear NODE GPU [CONDITION] --reason TEXT",
		Short: "Clear a false positive: end a GPU's condition by hand",
		Long: `clear asks the node's agent to end a condition it raised on one GPU, whatever the condition
would otherwise wait for (a GPU reset, a reboot, a quiet period): an operator's decision that it
was a false positive. The request goes on the Node (annotation gpuhealth.dev/gpu-clears); the
agent applies it once, posts an Event on the Node naming who asked, why and what it cleared (a
Warning if nothing matched), and removes the request. The condition is gone from every reporter;
if the fault happens again it is raised again, as any other.

GPU is an index, a UUID or a PCI bus ID; its MIG instances are cleared with it. CONDITION is a
reason as gpuhealth status shows it (XID79, UncorrectedECCErrors), a type (XID: every XID) or
TYPE:CODE (XID:79, NVLinkDown:3 for one link). Without it every condition of the GPU is cleared
but a drain, which only undrain ends. A condition whose cause is still there (a temperature, a
link that is down) comes back with the next reading.

With --wait the command waits for the agent and prints what it did; it fails if the agent
cleared nothing or did not answer in time (the request then stays for the agent to apply).`,
		Example: `  gpuhealth clear gpu-node-7 3 XID79 --reason "reseated the card, ticket 1234"
  gpuhealth clear gpu-node-7 GPU-76f99748-0f9a-e5e5-c69b-1e46cae6e125 --reason "bad batch of test jobs" --wait 1m`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(f.reason) == "" {
				return cmdutil.BadInput(errors.New("--reason: required (say why, for the next person)"))
			}
			if f.wait < 0 {
				return cmdutil.BadInput(fmt.Errorf("--wait: must not be negative, got %v", f.wait))
			}
			var condition string
			if len(args) == 3 {
				sel, err := gpuhealthv1.ParseConditionSelector(args[2])
				if err != nil {
					return cmdutil.BadInput(err)
				}
				condition = sel.String()
			}
			ctx := cmd.Context()
			client, by, err := asOperator(ctx, f.kubeconfig, f.by)
			if err != nil {
				return err
			}
			req := gpuhealthv1.Clear{Condition: condition, Reason: f.reason, By: by, At: time.Now().UTC().Truncate(time.Second)}
			node := args[0]
			gpu, err := requestClear(ctx, client, node, args[1], &req)
			if err != nil {
				return err
			}
			what := condition
			if what == "" {
				what = "every condition"
			}
			if note := clearNote(gpu, condition); note != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "note: GPU %d %s; the agent says in an Event whether anything matched\n", gpu.Index, note)
			}
			out := cmd.OutOrStdout()
			if f.wait == 0 {
				_, err = fmt.Fprintf(out, "requested clear of %s on GPU %d (%s) on node %s; the agent posts an Event when it has applied it (kubectl get events --field-selector involvedObject.name=%s)\n",
					what, req.Index, gpu.uuid, node, node)
				return err
			}
			return waitForClear(ctx, agentAnswer{client: client, node: node, uuid: gpu.uuid, timeout: f.wait, poll: clearPoll}, out, req)
		},
	}
	f.add(cmd, "why the condition is a false positive (required)", "who clears it",
		"wait this long for the agent to apply the request and print what it did (0: do not wait)")
	return cmd
}

// clearedGPU is the GPU a request names, as the agent last reported it.
type clearedGPU struct {
	uuid string
	gpuhealthv1.GPUSummary
	// instances are the reasons its MIG instances report.
	instanceReasons []string
}

// requestClear resolves gpu on node from the agent's report and adds req to the node's clear
// requests, with optimistic concurrency (addRequest). It sets req.Index.
func requestClear(ctx context.Context, client kubernetes.Interface, nodeName, gpu string, req *gpuhealthv1.Clear) (clearedGPU, error) {
	annotation := requestAnnotation[map[string][]gpuhealthv1.Clear]{
		key: gpuhealthv1.ClearsKey, fieldManager: "gpuhealth-clear", parse: gpuhealthv1.ParseClears, format: gpuhealthv1.FormatClears,
	}
	return addRequest(ctx, client, nodeName, gpu, annotation, func(clears map[string][]gpuhealthv1.Clear, target clearedGPU) error {
		req.Index = target.Index
		clears[target.uuid] = append(clears[target.uuid], *req)
		return nil
	})
}

// reportedGPU resolves gpu (an index, a UUID or a PCI bus ID) among the GPUs the node's agent
// reports: there is nothing to clear on a GPU it does not.
func reportedGPU(node *corev1.Node, gpu string) (clearedGPU, error) {
	uuid, _, err := resolveGPU(node, nil, gpu)
	if err != nil {
		return clearedGPU{}, err
	}
	summaries, err := gpuhealthv1.ParseHealth(node.Annotations[gpuhealthv1.HealthKey])
	if err != nil {
		return clearedGPU{}, fmt.Errorf("node %s: %w", node.Name, err)
	}
	s, ok := summaries[uuid]
	if !ok {
		return clearedGPU{}, fmt.Errorf("node %s reports no GPU %s: there is nothing to clear on it (see gpuhealth status --node %s)", node.Name, gpu, node.Name)
	}
	out := clearedGPU{uuid: uuid, GPUSummary: s}
	for _, inst := range summaries {
		if inst.ParentUUID == uuid {
			out.instanceReasons = append(out.instanceReasons, inst.Reasons...)
		}
	}
	return out, nil
}

// clearNote says why a request may match nothing, from the agent's last report ("" when it
// probably matches). The report shows reasons only, so a type or TYPE:CODE is left to the agent.
func clearNote(gpu clearedGPU, condition string) string {
	reasons := slices.DeleteFunc(slices.Concat(gpu.Reasons, gpu.instanceReasons), func(r string) bool { return r == health.ReasonAdminDrain })
	sel, _ := gpuhealthv1.ParseConditionSelector(condition)
	switch {
	case len(reasons) == 0 && slices.Contains(gpu.Reasons, health.ReasonAdminDrain):
		return "is drained and reports nothing else (gpuhealth undrain ends a drain)"
	case len(reasons) == 0:
		return "reports no condition now"
	case sel.Name == "" || sel.HasCode:
		return ""
	case slices.ContainsFunc(reasons, func(r string) bool { return strings.EqualFold(r, sel.Name) }):
		return ""
	case slices.ContainsFunc(reasons, func(r string) bool { return strings.HasPrefix(strings.ToUpper(r), strings.ToUpper(sel.Name)) }):
		return "" // a type such as XID, whose reasons are XID79, XID48...
	default:
		return fmt.Sprintf("reports %s, not %s, unless %s is a type", strings.Join(reasons, ", "), condition, condition)
	}
}

// waitForClear waits until the agent has removed req from node, then prints the Event that says
// what it did. A request that cleared nothing, or that the agent does not apply in time, is an
// error.
func waitForClear(ctx context.Context, a agentAnswer, out io.Writer, req gpuhealthv1.Clear) error {
	client, node, uuid, timeout, poll := a.client, a.node, a.uuid, a.timeout, a.poll
	mine, err := json.Marshal(req)
	if err != nil {
		return err
	}
	var (
		event   *corev1.Event
		removed *corev1.Node // the Node once the request is gone from it
	)
	err = wait.PollUntilContextTimeout(ctx, poll, timeout, true, func(ctx context.Context) (bool, error) {
		if removed == nil {
			n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return false, nil // keep waiting: the API server may be away for a moment
			}
			clears, _ := gpuhealthv1.ParseClears(n.Annotations[gpuhealthv1.ClearsKey])
			if slices.ContainsFunc(clears[uuid], func(c gpuhealthv1.Clear) bool {
				b, _ := json.Marshal(c)
				return string(b) == string(mine)
			}) {
				return false, nil
			}
			removed = n
		}
		event = clearEvent(ctx, client, node, req)
		return event != nil, nil
	})
	switch {
	case event != nil && event.Reason == gpuhealthv1.EventConditionsCleared:
		_, err := fmt.Fprintln(out, event.Message)
		return err
	case event != nil:
		return errors.New(event.Message)
	case ctx.Err() != nil:
		return ctx.Err()
	case removed != nil:
		// Applied, but its Event is not to be seen (Events cannot be listed, or were dropped):
		// say what the agent's report shows now.
		if n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
			removed = n
		}
		gpu, err := reportedGPU(removed, uuid)
		if err != nil {
			return err
		}
		state := gpu.Health
		if len(gpu.Reasons) > 0 {
			state += " (" + strings.Join(gpu.Reasons, ", ") + ")"
		}
		_, err = fmt.Fprintf(out, "the agent of node %s applied the request (no Event of it found); GPU %d (%s) reports %s\n", node, gpu.Index, uuid, state)
		return err
	case err != nil:
		return fmt.Errorf("the agent of node %s has not applied the request within %v (is it running there?); the request stays on the node until it does", node, timeout)
	}
	return nil
}

// agentAnswer is whom a command waits for, about which GPU, and how long: the node's agent,
// answering an operator's request (clear, validate) in an Event.
type agentAnswer struct {
	client        kubernetes.Interface
	node, uuid    string
	timeout, poll time.Duration
}

// requestFlags are the flags of the commands that put an operator's request on a Node for its
// agent (clear, validate).
type requestFlags struct {
	kubeconfig, reason, by string
	wait                   time.Duration
}

// add registers the flags on cmd, with what --reason, --by and --wait mean for it.
func (f *requestFlags) add(cmd *cobra.Command, reasonHelp, byHelp, waitHelp string) {
	addUserKubeconfig(cmd, &f.kubeconfig)
	cmd.Flags().StringVar(&f.reason, "reason", "", reasonHelp)
	cmd.Flags().StringVar(&f.by, "by", "", byHelp+" (default: the user the API server knows you as)")
	cmd.Flags().DurationVar(&f.wait, "wait", 0, waitHelp)
}

// addUserKubeconfig registers --kubeconfig on a command an operator runs from anywhere.
func addUserKubeconfig(cmd *cobra.Command, kubeconfig *string) {
	cmd.Flags().StringVar(kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
}

// nodeEvents lists the Events about node (the agent posts them in the default namespace).
func nodeEvents(ctx context.Context, client kubernetes.Interface, node string) (*corev1.EventList, error) {
	return client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node,
	})
}

// clearEvent finds the Event the agent posted for req: its message names the request.
func clearEvent(ctx context.Context, client kubernetes.Interface, node string, req gpuhealthv1.Clear) *corev1.Event {
	list, err := nodeEvents(ctx, client, node)
	if err != nil {
		return nil
	}
	for i := range list.Items {
		e := &list.Items[i]
		if (e.Reason == gpuhealthv1.EventConditionsCleared || e.Reason == gpuhealthv1.EventClearMatchedNothing) &&
			strings.Contains(e.Message, req.Message()) {
			return e
		}
	}
	return nil
}
