package nodecondition_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// domainBreaker holds back GPUs for a domain's budget.
type domainBreaker struct {
	heldBreaker
	domains []string
}

func (b *domainBreaker) HeldDomains() []string { return b.domains }

func TestTheBreakerConditionNamesTheDomain(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	cb := &domainBreaker{heldBreaker: heldBreaker{held: []string{"GPU-a"}}, domains: []string{"topology.kubernetes.io/rack=r7"}}
	s := nodecondition.New(adapt.Clientset(client), "n1", nodecondition.Options{Clock: clocktesting.NewFakePassiveClock(time.Unix(1000, 0)), Breaker: cb})
	snap := health.Snapshot{Devices: []health.DeviceStatus{device(0, health.Unhealthy, "XID79")}}
	if _, err := s.Sync(ctx, snap); err != nil {
		t.Fatal(err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == nodecondition.BreakerType {
			if c.Status != corev1.ConditionTrue || !strings.Contains(c.Message, "topology.kubernetes.io/rack=r7") || !strings.Contains(c.Message, "GPU-a") {
				t.Errorf("condition %+v, want True naming the domain and the GPU", c)
			}
			return
		}
	}
	t.Fatalf("no %s condition", nodecondition.BreakerType)
}
