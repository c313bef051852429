package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Peer lookups back off from peerLookupFirstRetry to peerLookupMaxRetry while an XID waits for
// its root cause.
const (
	peerLookupFirstRetry = time.Second
	peerLookupMaxRetry   = 30 * time.Second
)

// peerResolver reads the faults the agents of the other nodes of this node's NVLink domain (the
// nodes whose domain label has this node's value: the 18 nodes of a GB200 NVL72 rack) report on
// their gpu-health annotations, and hands them to the monitor, which attributes to them the XIDs
// this node's driver says an earlier XID caused.
//
// It reads them only when they matter (peersMatter): while this node has such an XID that
// nothing explains yet (Unhealthy, seen within the policy's RootCauseWindow), or one attributed
// to a peer's fault (which holds only while the peer reports the fault), it lists the domain's
// nodes at once and then again, backing off to every peerLookupMaxRetry, until neither is left.
// A watch of the domain's nodes would cost the API server a dispatch to every agent's watch for
// every Node change in the cluster (a label selector is not indexed, as the DeviceTaintRule
// syncer found at fleet scale); a LIST of 18 nodes every 30 s while a fault lasts costs little,
// and nothing at steady state. A node without the label looks nothing up, and an XID stays its
// GPU's own.
//
// A peer's report is its own claim: the faults PeerFaults refuses (a GPU UUID no NVML writes, a
// fault on a GPU the report does not mark Unhealthy) are reported once per report and not used,
// and what reaches this agent's log of a peer's text is bounded. A peer's malformed annotation
// is reported and its faults last read are kept: a typo must not turn an attribution back into
// a fault of this node's GPU, nor the reverse.
type peerResolver struct {
	client  kube.Interface
	nodes   *nodecache.Cache // this agent's own Node
	label   string
	monitor *health.Monitor
	clock   clock.WithTicker

	faults  map[string][]health.PeerFault // by peer node, as last read well
	bad     map[string]string             // peer node to the annotation it could not read, reported once
	refused map[string]string             // peer node to the refusals of its report last logged
	domain  string                        // the domain last looked up
}

// forget drops what the resolver knows of its peers, as when it starts or its domain changes.
func (r *peerResolver) forget() {
	r.faults, r.bad, r.refused = map[string][]health.PeerFault{}, map[string]string{}, map[string]string{}
}

// run looks peers up whenever they matter (peersMatter), until ctx is done.
func (r *peerResolver) run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("peers", r.label)
	ctx = klog.NewContext(ctx, logger)
	sub := r.monitor.Subscribe()
	defer sub.Close()
	if err := r.nodes.Start(ctx); err != nil {
		return err
	}
	r.forget()
	retry := peerLookupFirstRetry
	// Conditions change only by updates, so the latest update's snapshot is the monitor's
	// (no copy of our own); the window is read against the clock each time.
	snap := r.monitor.Snapshot()
	for {
		if !r.peersMatter(snap) {
			retry = peerLookupFirstRetry
			u, ok := sub.Wait(ctx)
			if !ok {
				return nil
			}
			snap = u.Snapshot
			continue
		}
		r.lookup(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-r.clock.After(retry):
		}
		retry = min(2*retry, peerLookupMaxRetry)
		if u, ok := sub.Next(); ok {
			snap = u.Snapshot
		}
	}
}

// peersMatter reports whether the peers' faults can change this node's conditions: an XID the
// driver says an earlier one caused waits for its root (still at its rule's severity, above
// Degraded, and seen within the policy's RootCauseWindow, so that a peer's fault could still
// explain it), or one is attributed to a peer's fault, which holds only while the peer reports
// it (health.AttributedToPeer).
func (r *peerResolver) peersMatter(snap health.Snapshot) bool {
	window := r.monitor.Tracker().Policy().RootCauseWindow
	now := r.clock.Now()
	for _, d := range snap.Devices {
		for _, c := range d.Conditions {
			if health.AttributedToPeer(c) {
				return true
			}
			if c.Type == health.ConditionXID && c.CausedByPrevious && c.Severity > health.Degraded && now.Sub(c.LastSeen) <= window {
				return true
			}
		}
	}
	return false
}

// lookup lists the domain's other nodes and hands their faults to the monitor.
func (r *peerResolver) lookup(ctx context.Context) {
	logger := klog.FromContext(ctx)
	self, err := r.nodes.Get(ctx)
	if err != nil {
		logger.Error(err, "Cannot read this node's NVLink domain")
		return
	}
	domain := self.Labels[r.label]
	if domain != r.domain {
		// Another domain has other peers (the node moved, or was labelled late).
		r.forget()
		r.domain = domain
		if domain == "" {
			logger.Info("An XID waits for its root cause or is attributed to a peer, but this node is in no NVLink domain (no label): it is its GPU's own")
		}
	}
	if domain == "" {
		r.publish(ctx)
		return
	}
	list, err := r.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{r.label: domain}).String(),
		FieldSelector: fields.OneTermNotEqualSelector("metadata.name", self.Name).String(),
	})
	if err != nil {
		logger.Error(err, "Cannot list the nodes of this node's NVLink domain; trying again", "domain", domain)
		return
	}
	seen := make(map[string]bool, len(list.Items))
	for i := range list.Items {
		seen[list.Items[i].Name] = true
		r.read(ctx, &list.Items[i])
	}
	// A peer that left the domain, or was deleted, is forgotten.
	for _, known := range []map[string]string{r.bad, r.refused} {
		maps.DeleteFunc(known, func(name, _ string) bool { return !seen[name] })
	}
	maps.DeleteFunc(r.faults, func(name string, _ []health.PeerFault) bool { return !seen[name] })
	logger.V(2).Info("Looked up the NVLink domain's faults", "domain", domain, "peers", len(list.Items))
	r.publish(ctx)
}

// read takes a peer's reported faults.
func (r *peerResolver) read(ctx context.Context, node *corev1.Node) {
	logger := klog.FromContext(ctx)
	value := node.Annotations[gpuhealthv1.HealthKey]
	summaries, err := gpuhealthv1.ParseHealth(value)
	if err != nil {
		if r.bad[node.Name] != value {
			r.bad[node.Name] = value
			logger.Error(bounded(err), "Ignoring a peer's malformed report; keeping its faults last read", "peer", node.Name)
		}
		return
	}
	delete(r.bad, node.Name)
	faults, refused := gpuhealthv1.PeerFaults(node.Name, summaries)
	if refused == nil {
		delete(r.refused, node.Name)
	} else if why := refused.Error(); r.refused[node.Name] != why {
		r.refused[node.Name] = why
		logger.Error(refused, "Refusing faults of a peer's report: no fault to attribute an XID to", "peer", node.Name)
	}
	if len(faults) > 0 {
		r.faults[node.Name] = faults
	} else {
		delete(r.faults, node.Name)
	}
}

// maxPeerError bounds what of a peer's malformed report this agent logs: a JSON error quotes a
// number literal whole, and the peer wrote it.
const maxPeerError = 256

// bounded is err, cut to maxPeerError characters when it is longer.
func bounded(err error) error {
	if s := err.Error(); len(s) > maxPeerError {
		return fmt.Errorf("%.*s... (%d bytes)", maxPeerError, s, len(s))
	}
	return err
}

// publish hands every peer's faults to the monitor.
func (r *peerResolver) publish(ctx context.Context) {
	var all []health.PeerFault
	for _, f := range r.faults {
		all = append(all, f...)
	}
	slices.SortFunc(all, func(a, b health.PeerFault) int { return a.Since.Compare(b.Since) })
	if err := r.monitor.SetPeerFaults(all, r.clock.Now()); err != nil {
		klog.FromContext(ctx).Error(err, "Dropped invalid peer faults")
	}
}
