package agent

import (
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Flow control for the agents' requests (API Priority and Fairness).
//
// Every agent of a DaemonSet authenticates as the same ServiceAccount, so the API server's
// default FlowSchemas put the whole fleet into one flow of the workload-low priority level, whose
// queues hold at most 300 requests of one flow (hand size 6 × queue length 50). When many GPUs
// fail at once, hundreds of agents write at the same moment and the rest are rejected with 429;
// client-go and the agent's writers retry with backoff, and the wave takes seconds longer than
// the writes themselves (measured by the fleet test: docs/benchmarks.md).
//
// FlowControl gives the agents a priority level of their own: its seats are not shared with other
// workloads (a wave of GPU faults cannot starve controllers, and a busy controller cannot delay
// taints), and, as the agents form a single flow, it has one long queue instead of many short
// ones. The Helm chart renders exactly these objects (a test compares them).
const (
	// FlowSchemaPrecedence sorts before service-accounts (9000), the schema that would match the
	// agents otherwise, and after the system's own schemas (system-nodes is 500,
	// kube-controller-manager and kube-scheduler 800).
	FlowSchemaPrecedence = 1000
	// flowConcurrencyShares is the level's share of the server's concurrency, next to
	// workload-low's 100 and global-default's 20: the agents are few requests most of the time
	// and bursts during waves, which borrowing from idle levels absorbs.
	flowConcurrencyShares = 20
	// flowLendablePercent lends half of the level's seats to busier levels while it is idle.
	flowLendablePercent = 50
	// DefaultFlowQueueLength is how many of the agents' requests may wait: a wave costs each
	// changed node four requests at once (the annotation, the rule, then the condition and an
	// Event), so 20,000 hold a wave on 5,000 nodes, and the start-up of as many agents. Measured
	// by the fleet test at 5,000 nodes × 8 GPUs (a wave on 4,000 nodes): with 5,000 the wave got
	// 8,883 rejections (429) and took 34.7 s, start-up 92.7 s; with 20,000, 714 rejections and
	// 21.6 s (1.31× bare clients sending the same writes), start-up 65.7 s. A waiting request
	// costs the API server a goroutine and its request, some tens of KiB: a full queue is a few
	// hundred MiB, only during such a wave. Requests wait at most a quarter of the request
	// timeout (15 s by default) before they are rejected anyway. The chart's
	// agent.flowControl.queueLengthLimit sets it.
	DefaultFlowQueueLength = 20000
)

// FlowControl returns the FlowSchema that routes the requests of the agents' ServiceAccount to
// their own PriorityLevelConfiguration, and that level, both called name, with a queue of
// queueLength requests.
func FlowControl(name, namespace, serviceAccount string, queueLength int32) (*flowcontrolv1.FlowSchema, *flowcontrolv1.PriorityLevelConfiguration) {
	level := &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To[int32](flowConcurrencyShares),
				LendablePercent:          ptr.To[int32](flowLendablePercent),
				LimitResponse: flowcontrolv1.LimitResponse{
					Type: flowcontrolv1.LimitResponseTypeQueue,
					// One flow: fair queuing among flows has nothing to share out, so one queue.
					Queuing: &flowcontrolv1.QueuingConfiguration{Queues: 1, HandSize: 1, QueueLengthLimit: queueLength},
				},
			},
		},
	}
	schema := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: name},
			MatchingPrecedence:         FlowSchemaPrecedence,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{
					Kind:           flowcontrolv1.SubjectKindServiceAccount,
					ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: namespace, Name: serviceAccount},
				}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs: []string{flowcontrolv1.VerbAll}, APIGroups: []string{flowcontrolv1.APIGroupAll},
					Resources: []string{flowcontrolv1.ResourceAll}, ClusterScope: true, Namespaces: []string{flowcontrolv1.NamespaceEvery},
				}},
			}},
		},
	}
	return schema, level
}
