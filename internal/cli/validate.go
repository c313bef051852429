package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func newValidateCommand() *cobra.Command {
	var f requestFlags
	cmd := &cobra.Command{
		Use:   "validate NODE GPU [--reason TEXT] [--wait DUR]",
		Short: "Test one GPU actively before it is trusted again",
		Long: `validate asks the node's agent to test one GPU (remediation.validation: by default DCGM's
level-2 diagnostic of that GPU alone) before it is trusted again: the GPU leaves service (tainted,
marked unhealthy on every scheduler's path), waits until no pod holds it, as a repair does, is
tested while the node's other GPUs keep working, and goes back only if the test passes. A failed
test is a failed repair attempt (remediation resets it, and gives up after maxAttempts). The
request goes on the Node (annotation gpuhealth.dev/gpu-validation-requests); the agent applies it
once and removes it. A node whose agent does not validate says so in a Warning Event.

GPU is an index, a UUID or a PCI bus ID. With --wait the command waits for the verdict and prints
it: it exits 0 when the GPU passed, 1 when it failed, could not be validated on that node, or no
verdict came in time (a test that gives no verdict is retried by the agent; the GPU stays out).`,
		Example: `  gpuhealth validate gpu-node-7 3 --reason "card reseated, ticket 1234"
  gpuhealth validate gpu-node-7 GPU-76f99748-0f9a-e5e5-c69b-1e46cae6e125 --reason "after RMA" --wait 10m`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.wait < 0 {
				return cmdutil.BadInput(fmt.Errorf("--wait: must not be negative, got %v", f.wait))
			}
			if strings.TrimSpace(f.reason) == "" {
				f.reason = "requested with gpuhealth validate"
			}
			ctx := cmd.Context()
			client, by, err := asOperator(ctx, f.kubeconfig, f.by)
			if err != nil {
				return err
			}
			req := gpuhealthv1.ValidationRequest{Reason: f.reason, By: by, At: time.Now().UTC().Truncate(time.Second)}
			node := args[0]
			uuid, err := requestValidation(ctx, client, node, args[1], &req)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.wait == 0 {
				_, err = fmt.Fprintf(out, "requested validation of GPU %d (%s) on node %s; the agent posts GPUValidation Events with the verdict (kubectl get events --field-selector involvedObject.name=%s)\n",
					req.Index, uuid, node, node)
				return err
			}
			return waitForValidation(ctx, agentAnswer{client: client, node: node, uuid: uuid, timeout: f.wait, poll: clearPoll}, out, req)
		},
	}
	f.add(cmd, "why the GPU is to be tested, for the next person", "who asks",
		"wait this long for the verdict and print it (0: do not wait)")
	return cmd
}

// requestValidation resolves gpu on node from the agent's report and adds req to the node's
// validation requests (a newer request of the same GPU replaces an older one), with optimistic
// concurrency as requestClear does. It sets req.Index and returns the GPU's UUID.
func requestValidation(ctx context.Context, client kubernetes.Interface, nodeName, gpu string, req *gpuhealthv1.ValidationRequest) (string, error) {
	annotation := requestAnnotation[map[string]gpuhealthv1.ValidationRequest]{
		key: gpuhealthv1.ValidationRequestsKey, fieldManager: "gpuhealth-validate",
		parse: gpuhealthv1.ParseValidationRequests, format: gpuhealthv1.FormatValidationRequests,
	}
	target, err := addRequest(ctx, client, nodeName, gpu, annotation, func(requests map[string]gpuhealthv1.ValidationRequest, target clearedGPU) error {
		switch {
		case target.ParentUUID != "":
			return cmdutil.BadInput(fmt.Errorf("GPU %s of node %s is a MIG instance: validate its GPU, %s", gpu, nodeName, target.ParentUUID))
		case target.Missing:
			return cmdutil.BadInput(fmt.Errorf("GPU %s of node %s is missing: the driver does not answer for it, there is nothing to test", gpu, nodeName))
		}
		req.Index = target.Index
		requests[target.uuid] = *req
		return nil
	})
	return target.uuid, err
}

// waitForValidation waits for the verdict of the validation req asked for: the agent's Event
// that started it (it names the request) and the first verdict of that GPU after it. A verdict
// of no verdict (GPUValidationError) is printed and waited past: the agent tries again.
func waitForValidation(ctx context.Context, a agentAnswer, out io.Writer, req gpuhealthv1.ValidationRequest) error {
	client, node, uuid, timeout, poll := a.client, a.node, a.uuid, a.timeout, a.poll
	var (
		started time.Time
		final   *corev1.Event
		said    = map[string]bool{}
	)
	err := wait.PollUntilContextTimeout(ctx, poll, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := nodeEvents(ctx, client, node)
		if err != nil {
			return false, nil // keep waiting: the API server may be away for a moment
		}
		for i := range list.Items {
			e := &list.Items[i]
			if !strings.Contains(e.Message, uuid) && !strings.Contains(e.Message, req.Message()) {
				continue
			}
			switch {
			case e.Reason == gpuhealthv1.EventValidationNotConfigured && strings.Contains(e.Message, req.Message()):
				final = e
				return true, nil
			case started.IsZero() && strings.Contains(e.Message, req.Message()):
				started = eventTime(e)
			}
		}
		if started.IsZero() {
			return false, nil
		}
		for i := range list.Items {
			e := &list.Items[i]
			if !strings.Contains(e.Message, uuid) || eventTime(e).Before(started) {
				continue
			}
			switch e.Reason {
			case gpuhealthv1.EventValidationPassed, gpuhealthv1.EventValidationFailed:
				final = e
				return true, nil
			case gpuhealthv1.EventValidationError:
				if !said[e.Message] {
					said[e.Message] = true
					fmt.Fprintln(out, "no verdict yet (the agent tries again):", e.Message)
				}
			}
		}
		return false, nil
	})
	switch {
	case final != nil && final.Reason == gpuhealthv1.EventValidationPassed:
		_, err := fmt.Fprintln(out, "passed:", final.Message)
		return err
	case final != nil && final.Reason == gpuhealthv1.EventValidationFailed:
		return errors.New("failed: " + final.Message)
	case final != nil:
		return errors.New(final.Message)
	case ctx.Err() != nil:
		return ctx.Err()
	case started.IsZero() && err != nil:
		return fmt.Errorf("the agent of node %s has not taken the request within %v (is it running there?); the request stays on the node until it does", node, timeout)
	case err != nil:
		return fmt.Errorf("no verdict for GPU %s within %v: the GPU stays out of service until its validation passes (gpuhealth status --node %s)", uuid, timeout, node)
	}
	return nil
}

// eventTime is when an Event last happened, to the second.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	default:
		return e.CreationTimestamp.Time
	}
}
