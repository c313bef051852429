//go:build e2e

package fleet

import (
	"context"
	"encoding/json"
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
// Event) and, for every failing node at once, sends the same writes in the agents' order: the
// annotation patch and the rules together, then the condition and the Event. A node with a real
// agent gets a client of its own (the agents' identity and rate limits, a connection of its own);
// the simulated nodes share simClients clients, as their wave did. It times, through watches,
// until every copied annotation and rule is seen, as the agents' wave is timed.
func bareWave(t *testing.T, admin kubernetes.Interface, agentCfg *rest.Config, fleet []*fleetNode, fig *Figures) {
	t.Helper()
	ctx := t.Context()
	failing, _, _ := waveTargets(fleet)

	// The payloads, built before anything is timed, from one list of the Nodes and one of the rules.
	counter := newRequestCounter()
	nodeList, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ruleList, err := admin.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodesByName := make(map[string]*corev1.Node, len(nodeList.Items))
	for i := range nodeList.Items {
		nodesByName[nodeList.Items[i].Name] = &nodeList.Items[i]
	}
	rulesByName := make(map[string]*resourcev1.DeviceTaintRule, len(ruleList.Items))
	for i := range ruleList.Items {
		rulesByName[ruleList.Items[i].Name] = &ruleList.Items[i]
	}
	shared := newSimFleet(t, agentCfg, counter, 0)
	wantIDs, wantRules := map[string]string{}, map[string]bool{}
	ruleNode := map[string]string{}
	var writes []*simWrite
	k := 0
	for n, gpus := range failing {
		node := nodesByName[n.name]
		if node == nil {
			t.Fatalf("node %s not listed", n.name)
		}
		w := &simWrite{node: n.name}
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
			rule := rulesByName[name]
			if rule == nil {
				t.Fatalf("DeviceTaintRule %s not listed", name)
			}
			w.rules = append(w.rules, &resourcev1.DeviceTaintRule{
				ObjectMeta: metav1.ObjectMeta{Name: bareRulePrefix + name, Labels: map[string]string{devicetaint.NodeLabel: bareRulePrefix + n.name}},
				Spec:       rule.Spec,
			})
			wantRules[bareRulePrefix+name] = true
			ruleNode[bareRulePrefix+name] = n.name
		}
		w.event = waveEvent(n.name, "gpuhealth-bare", "BareWave", cond.Message)
		w.event.GenerateName = n.name + ".bare-"
		if n.simulated {
			w.client, w.shared = shared.client(k), true
			k++
		} else {
			cfg := rest.CopyConfig(agentCfg)
			cfg.QPS, cfg.Burst = agent.ClientQPS, agent.ClientBurst
			cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil } // own transport, as in the agents' wave
			cfg.WrapTransport = counter.wrap
			if w.client, err = kubernetes.NewForConfig(cfg); err != nil {
				t.Fatal(err)
			}
		}
		writes = append(writes, w)
	}

	// The agents' connections are open when their wave starts; so are the bare clients'.
	var warm errgroup.Group
	warm.SetLimit(64)
	warmed := map[kubernetes.Interface]bool{}
	for _, w := range writes {
		if warmed[w.client] {
			continue
		}
		warmed[w.client] = true
		warm.Go(func() error {
			_, err := w.client.CoreV1().Nodes().Get(ctx, w.node, metav1.GetOptions{})
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
	// As in the agents' wave: each node with a real agent sends at once, the simulated nodes
	// simSenders at a time.
	var senders errgroup.Group
	var pooled []*simWrite
	stopProfile := profileWave(t, admin, "bare")
	start := time.Now()
	for _, w := range writes {
		if w.shared {
			pooled = append(pooled, w)
			continue
		}
		senders.Go(func() error { return w.send(ctx, "gpuhealth-bare") })
	}
	sendErrs := sendAll(ctx, pooled, "gpuhealth-bare")

	pendingIDs, pendingRules := maps.Clone(wantIDs), maps.Clone(wantRules)
	var lastIDs, lastRules time.Duration
	taint := map[string][2]time.Duration{}
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
		case err := <-sendErrs:
			if err != nil {
				t.Fatalf("bare wave: %v", err)
			}
			sendErrs = nil
		case <-deadline:
			t.Fatalf("bare wave, after %v: %d annotations and %d rules still missing", convergeLimit, len(pendingIDs), len(pendingRules))
		}
		now := time.Since(start)
		switch obj := obj.(type) {
		case *corev1.Node:
			if want, ok := pendingIDs[obj.Name]; ok && obj.Annotations[bareKeyPrefix+baseName(gpuhealthv1.UnhealthyIDsKey)] == want {
				delete(pendingIDs, obj.Name)
				lastIDs = now
				seen := taint[obj.Name]
				seen[0] = now
				taint[obj.Name] = seen
			}
		case *resourcev1.DeviceTaintRule:
			if pendingRules[obj.Name] {
				delete(pendingRules, obj.Name)
				lastRules = now
				seen := taint[ruleNode[obj.Name]]
				seen[1] = now
				taint[ruleNode[obj.Name]] = seen
			}
		}
	}
	stopProfile()
	if err := senders.Wait(); err != nil {
		t.Fatalf("bare wave: %v", err)
	}
	if sendErrs != nil {
		if err := <-sendErrs; err != nil {
			t.Fatalf("bare wave: %v", err)
		}
	}
	fig.BareWaveAllSeconds = max(lastIDs, lastRules).Seconds()
	fig.BareWaveTaint = taintTimes(taint)
	fig.BareWaveByKind = diff(counter.snapshot(), before)
	fig.BareWaveRequests = total(fig.BareWaveByKind)
}

// baseName is an annotation key without its prefix.
func baseName(key string) string { return key[strings.LastIndex(key, "/")+1:] }
