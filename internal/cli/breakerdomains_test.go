package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
)

func TestBreakerStatusShowsTheDomains(t *testing.T) {
	const ns, rack = "gpuhealth-system", "topology.kubernetes.io/rack"
	now := time.Now()
	domainSlot := func(value string, k int) *coordinationv1.Lease {
		key := breaker.DomainKey(rack, value)
		holder := "n/GPU-" + value
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: breaker.SlotPrefix + key + "-" + string(rune('0'+k)),
			Labels: map[string]string{breaker.DomainSlotLabel: key}, CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: breaker.ConfigMapName}, Data: map[string]string{
		breaker.ClusterGPUsKey: "16", breaker.DomainGPUsKey: `{"` + rack + `":{"a":8,"b":8}}`, breaker.DomainFractionsKey: `{"` + rack + `":0.25}`,
		breaker.DomainValuesDroppedKey: "3"}}
	client := fake.NewClientset(cm, domainSlot("a", 0), domainSlot("a", 1), domainSlot("b", 0))
	var out bytes.Buffer
	if err := breakerStatus(context.Background(), client, ns, 10*time.Minute, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"cluster GPUs: 16", "domain values not counted (past 4096): 3",
		rack + "   a       8      2        2      yes", rack + "   b       8      2        1      no"} {
		if !strings.Contains(got, want) {
			t.Errorf("status lacks %q:\n%s", want, got)
		}
	}
	if strings.Count(got, " yes\n") != 1 {
		t.Errorf("the domain slots must not be listed among the cluster's slots:\n%s", got)
	}
}

func TestParseBreakerDomains(t *testing.T) {
	got, err := parseBreakerDomains([]string{"topology.kubernetes.io/rack=0.25", "pool=1"})
	if err != nil || len(got) != 2 || got[0] != (breaker.Domain{Label: "topology.kubernetes.io/rack", MaxFraction: 0.25}) || got[1].MaxFraction != 1 {
		t.Fatalf("parseBreakerDomains = %+v, %v", got, err)
	}
	for _, bad := range [][]string{{"rack"}, {"rack=lots"}, {"rack=0"}, {"rack=2"}, {"Bad Label=0.1"}, {"r=0.1", "r=0.2"}} {
		if _, err := parseBreakerDomains(bad); err == nil {
			t.Errorf("parseBreakerDomains(%q) took it", bad)
		}
	}
}
