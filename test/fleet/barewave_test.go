//go:build e2e

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// The bare wave's copies of the agents' objects: annotations under their own keys, rules under
// their own names and node label, and a condition of its own type, so that no agent sees them as
// its own.
const (
	bareKeyPrefix     = "bare.gpuhealth.dev/"
	bareRulePrefix    = "bare-"
	bareConditionType = "BareWave"
)

// bareWave measures the limit the agents' wave is compared with: what the API server does with
// the same requests and no agent logic. Once the agents' wave has settled, it copies what each
// failing node's agent wrote (its three annotations, its DeviceTaintRules, its condition and an
// Event) and, for every failing node at once, with that node's own client (the agents' identity
// and rate limits, a connection of its own), sends the same writes in the agents' order: the
// annotation patch and the rules together, then the condition and the Event. It times, through
// watches, until every copied annotation and rule is seen, as the agents' wave is timed.
func bareWave(t *testing.T, admin kubernetes.Interface, agentCfg *rest.Config, fleet []*fleetNode, fig *Figures) {
	t.Helper()
	ctx := t.Context()
	failing, _, _ := waveTargets(fleet)

	// The payloads, built before anything is timed.
	type nodeWrites struct {
		name       string
		annotation []byte
		status     []byte
		rules      []*resourcev1.DeviceTaintRule
		event      *corev1.Event
		client     kubernetes.Interface
	}
	counter := newRequestCounter()
	wantIDs, wantRules := map[string]string{}, map[string]bool{}
	var writes []*nodeWrites
	for n, gpus := range failing {
		node, err := admin.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w := &nodeWrites{name: n.name}
		copied := map[string]string{}
		for _, key := range []string{gpuhealthv1.UnhealthyIDsKey, gpuhealthv1.HealthKey, gpuhealthv1.VolcanoStateKey} {
			copied[bareKeyPrefix+baseName(key)] = node.Annotations[key]
		}
		wantIDs[n.name] = copied[bareKeyPrefix+baseName(gpuhealthv1.UnhealthyIDsKey)]
		if w.annotation, err = json.Marshal(map[string]any{"metadata": map[string]any{"annotations": copied}}); err != nil {
			t.Fatal(err)
		}
		cond := corev1.NodeCondition{Type: bareConditionType, Status: corev1.ConditionTrue, Reason: "Bare", Message: "bare wave", LastTransitionTime: metav1.Now()}
		for _, c := range node.Status.Conditions {
			if c.Type == gpuhealthv1.ConditionGPUUnhealthy {
				cond.Reason, cond.Message = c.Reason, c.Message
			}
		}
		if w.status, err = json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}}); err != nil {
			t.Fatal(err)
		}
		for _, g := range gpus {
			name := devicetaint.RuleName(n.name, n.uuids[g])
			rule, err := admin.ResourceV1().DeviceTaintRules().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			w.rules = append(w.rules, &resourcev1.DeviceTaintRule{
				ObjectMeta: metav1.ObjectMeta{Name: bareRulePrefix + name, Labels: map[string]string{devicetaint.NodeLabel: bareRulePrefix + n.name}},
				Spec:       rule.Spec,
			})
			wantRules[bareRulePrefix+name] = true
		}
		w.event = &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: n.name + ".bare-", Namespace: metav1.NamespaceDefault},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: n.name},
			Reason:         "BareWave", Message: cond.Message, Type: corev1.EventTypeWarning, Count: 1,
			Source:         corev1.EventSource{Component: "gpuhealth-bare", Host: n.name},
			FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(),
		}
		cfg := rest.CopyConfig(agentCfg)
		cfg.QPS, cfg.Burst = agent.ClientQPS, agent.ClientBurst
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil } // own transport, as in the agents' wave
		cfg.WrapTransport = counter.wrap
		if w.client, err = kubernetes.NewForConfig(cfg); err != nil {
			t.Fatal(err)
		}
		writes = append(writes, w)
	}

	// The agents' connections are open when their wave starts; so are the bare clients'.
	var warm errgroup.Group
	for _, w := range writes {
		warm.Go(func() error {
			_, err := w.client.CoreV1().Nodes().Get(ctx, w.name, metav1.GetOptions{})
			return err
		})
	}
	if err := warm.Wait(); err != nil {
		t.Fatal(err)
	}
	before := counter.snapshot()

	nodes, rules := observeNodesAndRules(admin)
	watchCtx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	for _, o := range []*observed{nodes, rules} {
		if _, err := o.start(watchCtx); err != nil {
			t.Fatal(err)
		}
	}
	var senders errgroup.Group
	stopProfile := profileWave(t, admin, "bare")
	start := time.Now()
	for _, w := range writes {
		senders.Go(func() error {
			var first errgroup.Group
			first.Go(func() error {
				_, err := w.client.CoreV1().Nodes().Patch(ctx, w.name, types.MergePatchType, w.annotation, metav1.PatchOptions{FieldManager: "gpuhealth-bare"})
				return err
			})
			for _, r := range w.rules {
				first.Go(func() error {
					_, err := w.client.ResourceV1().DeviceTaintRules().Create(ctx, r, metav1.CreateOptions{FieldManager: "gpuhealth-bare"})
					return err
				})
			}
			if err := first.Wait(); err != nil {
				return fmt.Errorf("%s: %w", w.name, err)
			}
			var then errgroup.Group
			then.Go(func() error {
				_, err := w.client.CoreV1().Nodes().Patch(ctx, w.name, types.StrategicMergePatchType, w.status, metav1.PatchOptions{FieldManager: "gpuhealth-bare"}, "status")
				return err
			})
			then.Go(func() error {
				_, err := w.client.CoreV1().Events(w.event.Namespace).Create(ctx, w.event, metav1.CreateOptions{})
				return err
			})
			if err := then.Wait(); err != nil {
				return fmt.Errorf("%s: %w", w.name, err)
			}
			return nil
		})
	}

	pendingIDs, pendingRules := maps.Clone(wantIDs), maps.Clone(wantRules)
	var lastIDs, lastRules time.Duration
	deadline := time.After(convergeLimit)
	for len(pendingIDs)+len(pendingRules) > 0 {
		var obj k8sruntime.Object
		select {
		case obj = <-nodes.objects:
		case obj = <-rules.objects:
		case err := <-nodes.errs:
			t.Fatal(err)
		case err := <-rules.errs:
			t.Fatal(err)
		case <-deadline:
			t.Fatalf("bare wave, after %v: %d annotations and %d rules still missing", convergeLimit, len(pendingIDs), len(pendingRules))
		}
		now := time.Since(start)
		switch obj := obj.(type) {
		case *corev1.Node:
			if want, ok := pendingIDs[obj.Name]; ok && obj.Annotations[bareKeyPrefix+baseName(gpuhealthv1.UnhealthyIDsKey)] == want {
				delete(pendingIDs, obj.Name)
				lastIDs = now
			}
		case *resourcev1.DeviceTaintRule:
			if pendingRules[obj.Name] {
				delete(pendingRules, obj.Name)
				lastRules = now
			}
		}
	}
	stopProfile()
	if err := senders.Wait(); err != nil {
		t.Fatalf("bare wave: %v", err)
	}
	fig.BareWaveAllSeconds = max(lastIDs, lastRules).Seconds()
	fig.BareWaveByKind = diff(counter.snapshot(), before)
	fig.BareWaveRequests = total(fig.BareWaveByKind)
}

// baseName is an annotation key without its prefix.
func baseName(key string) string { return key[strings.LastIndex(key, "/")+1:] }
