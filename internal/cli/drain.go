package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func newDrainCommand() *cobra.Command {
	var kubeconfig, reason, by string
	cmd := &cobra.Command{
		Use:   "drain NODE GPU --reason TEXT",
		Short: "Take one GPU out of service, like kubectl cordon for a single card",
		Long: `drain marks one GPU of a node as administratively drained. Every reporter of the node's agent
then treats it as Unhealthy with reason AdminDrain - the Volcano annotation, the DRA
DeviceTaintRule, the extender - without touching the indexes of the other GPUs. The drain lives
on the Node (annotation gpuhealth.dev/gpu-drains), so it survives agent restarts and node
reboots; only undrain ends it. Who drained the GPU, when and why are kept.

GPU is an index, a UUID or a PCI bus ID; indexes and bus IDs are resolved through the agent's
gpuhealth.dev/gpu-health annotation.`,
		Example: `  gpuhealth drain gpu-node-7 3 --reason "fan noise, RMA ticket 1234"
  gpuhealth drain gpu-node-7 GPU-76f99748-0f9a-e5e5-c69b-1e46cae6e125 --reason "XID 79 twice this week"`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return cmdutil.BadInput(errors.New("--reason: required (say why, for the next person)"))
			}
			ctx := cmd.Context()
			client, by, err := asOperator(ctx, kubeconfig, by)
			if err != nil {
				return err
			}
			return changeDrainsAndSay(cmd, client, args, "drained", func(drains map[string]gpuhealthv1.Drain, uuid string, index int) (bool, error) {
				drains[uuid] = gpuhealthv1.Drain{Index: index, Reason: reason, By: by, At: time.Now().UTC().Truncate(time.Second)}
				return true, nil
			})
		},
	}
	addUserKubeconfig(cmd, &kubeconfig)
	cmd.Flags().StringVar(&reason, "reason", "", "why the GPU is drained (required)")
	cmd.Flags().StringVar(&by, "by", "", "who drains it (default: the user the API server knows you as)")
	return cmd
}

func newUndrainCommand() *cobra.Command {
	var kubeconfig string
	cmd := &cobra.Command{
		Use:   "undrain NODE GPU",
		Short: "Return a drained GPU to service",
		Long: `undrain ends the administrative drain of one GPU. The GPU is schedulable again once no other
condition keeps it Unhealthy. GPU is an index, a UUID or a PCI bus ID.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, err := newUserClient(kubeconfig)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			return changeDrainsAndSay(cmd, client, args, "undrained", func(drains map[string]gpuhealthv1.Drain, uuid string, _ int) (bool, error) {
				if _, ok := drains[uuid]; !ok {
					return false, nil
				}
				delete(drains, uuid)
				return true, nil
			})
		},
	}
	addUserKubeconfig(cmd, &kubeconfig)
	return cmd
}

// changeDrainsAndSay applies change to the drains of node args[0] for GPU args[1] and prints
// what was done (verb) to which GPU.
func changeDrainsAndSay(cmd *cobra.Command, client kubernetes.Interface, args []string, verb string,
	change func(drains map[string]gpuhealthv1.Drain, uuid string, index int) (bool, error)) error {
	uuid, index, err := changeDrains(cmd.Context(), client, args[0], args[1], change)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s GPU %d (%s) on node %s\n", verb, index, uuid, args[0])
	return err
}

// changeDrains resolves gpu on node and applies change to the node's drains with optimistic
// concurrency: the patch carries the resourceVersion it read, and a conflict (someone else
// changed the node meanwhile) reads and tries again, so two drains at once never lose one.
func changeDrains(ctx context.Context, client kubernetes.Interface, nodeName, gpu string,
	change func(drains map[string]gpuhealthv1.Drain, uuid string, index int) (bool, error)) (string, int, error) {
	var uuid string
	var index int
	err := updateNodeAnnotation(ctx, client, nodeName, gpuhealthv1.DrainsKey, "gpuhealth-drain", func(node *corev1.Node) (any, bool, error) {
		drains, err := gpuhealthv1.ParseDrains(node.Annotations[gpuhealthv1.DrainsKey])
		if err != nil {
			return nil, false, fmt.Errorf("node %s: %w (fix or remove the annotation by hand)", nodeName, err)
		}
		if uuid, index, err = resolveGPU(node, drains, gpu); err != nil {
			return nil, false, cmdutil.BadInput(err)
		}
		changed, err := change(drains, uuid, index)
		if err != nil || !changed {
			return nil, false, err
		}
		value, err := gpuhealthv1.FormatDrains(drains)
		if value == "" {
			return nil, true, err // null removes the annotation
		}
		return value, true, err
	})
	return uuid, index, err
}

// resolveGPU turns an index, UUID or PCI bus ID into the GPU's UUID and index, using the agent's
// health annotation and the drains already recorded.
func resolveGPU(node *corev1.Node, drains map[string]gpuhealthv1.Drain, gpu string) (string, int, error) {
	summaries, err := gpuhealthv1.ParseHealth(node.Annotations[gpuhealthv1.HealthKey])
	if err != nil {
		return "", 0, fmt.Errorf("node %s: %w", node.Name, err)
	}
	index, isIndex := -1, false
	if i, err := strconv.Atoi(gpu); err == nil && i >= 0 {
		index, isIndex = i, true
	}
	for uuid, s := range summaries {
		if s.ParentUUID != "" {
			continue // indexes and bus IDs name whole cards
		}
		switch {
		case strings.EqualFold(uuid, gpu):
			return uuid, s.Index, nil
		case isIndex && s.Index == index:
			return uuid, s.Index, nil
		case s.PCIBusID != "" && strings.EqualFold(normalizeBusID(s.PCIBusID), normalizeBusID(gpu)):
			return uuid, s.Index, nil
		}
	}
	for uuid, d := range drains {
		if strings.EqualFold(uuid, gpu) || (isIndex && d.Index == index) {
			return uuid, d.Index, nil
		}
	}
	if strings.HasPrefix(strings.ToUpper(gpu), "GPU-") {
		return gpu, -1, nil // a UUID the agent has not reported (yet): accept it as given
	}
	if len(summaries) == 0 {
		return "", 0, fmt.Errorf("node %s has no %s annotation to resolve GPU %q: is the gpuhealth agent running there? Name the GPU by UUID instead", node.Name, gpuhealthv1.HealthKey, gpu)
	}
	return "", 0, fmt.Errorf("node %s has no GPU %q (give an index, a UUID or a PCI bus ID; see gpuhealth status --node %s)", node.Name, gpu, node.Name)
}

// normalizeBusID compares bus IDs written with 4 or 8 domain digits alike; what is no PCI
// address stays as typed, in lower case.
func normalizeBusID(id string) string {
	if n, err := health.NormalizePCIBusID(id); err == nil {
		return n
	}
	return strings.ToLower(id)
}

// asOperator returns the API client of the user running an operator's command and who they are:
// by when given, else what the API server knows them as.
func asOperator(ctx context.Context, kubeconfig, by string) (kubernetes.Interface, string, error) {
	client, err := newUserClient(kubeconfig)
	if err != nil {
		return nil, "", cmdutil.BadInput(err)
	}
	if by == "" {
		by = whoAmI(ctx, client)
	}
	return client, by, nil
}

// whoAmI asks the API server who the caller is; it falls back to "unknown".
func whoAmI(ctx context.Context, client kubernetes.Interface) string {
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil || review.Status.UserInfo.Username == "" {
		return "unknown"
	}
	return review.Status.UserInfo.Username
}
