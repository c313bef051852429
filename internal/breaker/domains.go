package breaker

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// Budgets per domain. A Domain is a node label whose every value (a rack, a switch, a node pool)
// has a budget of its own besides the cluster's: MaxFraction of that value's GPUs. An agent
// admits a GPU only when its node's value of every domain label admits it and then the cluster's
// budget does; a node without the label is under the cluster's budget only. One bad rack is held
// at its own budget, and a wave over the whole cluster still meets the cluster's.
//
// Each value's slots are a SlotPool of their own, gpuhealth-breaker-slot-<key>-<k>, where key is
// DomainKey(label, value): a value may be 63 characters of any case and a label 316, more than a
// Lease name can carry, so both are hashed. The slots keep the cluster slots' prefix, so the
// admission policy's checks (only slots naming the agent's own node, never updated, deleted only
// by their node) hold for them unchanged; they carry DomainSlotLabel=<key> instead of SlotLabel,
// so listing one pool never reads another's.
//
// The breaker controller's Counter writes each value's GPUs into the breaker's ConfigMap
// (DomainGPUsKey), at most MaxDomainValues values in all; its DomainWatcher deletes the domain
// slots that stopped counting and reports a domain whose budget is used up, once.

// Domain is a budget per value of a node label.
type Domain struct {
	Label       string
	MaxFraction float64
}

// The ConfigMap's keys and the domain slots' label.
const (
	// DomainGPUsKey holds the GPUs of each domain value: JSON {"<label>": {"<value>": gpus}}.
	DomainGPUsKey = "domainGPUs"
	// DomainFractionsKey holds the controller's maxFraction of each label (JSON {"<label>": f}),
	// for `gpuhealth breaker status`; the agents use their own configuration's.
	DomainFractionsKey = "domainFractions"
	// DomainValuesDroppedKey is how many domain values were left out of DomainGPUsKey past
	// MaxDomainValues (absent: none).
	DomainValuesDroppedKey = "domainValuesDropped"
	// DomainSlotLabel marks a domain's slot Leases, valued with DomainKey.
	DomainSlotLabel = "gpuhealth.dev/breaker-domain-slot"
)

// MaxDomainValues bounds the domain values the Counter writes into the ConfigMap (every agent
// watches it): 4,096 values of 63 characters are about 300 KiB, within a ConfigMap's 1 MiB. The
// values past it, in the order of label and value, are not counted: their nodes are under the
// cluster's budget only, and the Counter says so (a warning, DomainValuesDroppedKey).
const MaxDomainValues = 4096

// DomainKey names a domain value's slot pool: 12 hex digits of SHA-256 of label and value. Two
// values of the 4,096 counted share a key with odds of about 3 in 10^7; they would then share one
// budget, the smaller of the two.
func DomainKey(label, value string) string {
	sum := sha256.Sum256([]byte(label + "\x00" + value))
	return hex.EncodeToString(sum[:6])
}

// DomainSlots is the slot pool of one domain value.
func DomainSlots(client kube.Interface, namespace, label, value string) SlotPool {
	key := DomainKey(label, value)
	return SlotPool{Client: client, Namespace: namespace, Prefix: SlotPrefix + key + "-", Label: DomainSlotLabel, LabelValue: key,
		FieldManager: "gpuhealth-agent"}
}

// DomainGPUs is what the Counter counted per domain: label → value → GPUs.
type DomainGPUs map[string]map[string]int

// ParseDomainGPUs reads the domain counts from the breaker's ConfigMap; absent or malformed
// counts are none (the domains' budgets do not apply, the cluster's does), and so are counts
// that are not positive.
func ParseDomainGPUs(cm *corev1.ConfigMap) DomainGPUs {
	var d DomainGPUs
	if cm == nil || json.Unmarshal([]byte(cm.Data[DomainGPUsKey]), &d) != nil {
		return nil
	}
	for _, values := range d {
		for v, n := range values {
			if n <= 0 {
				delete(values, v)
			}
		}
	}
	return d
}

// ParseDomainFractions reads the controller's maxFraction per label from the ConfigMap.
func ParseDomainFractions(cm *corev1.ConfigMap) map[string]float64 {
	var f map[string]float64
	if cm == nil || json.Unmarshal([]byte(cm.Data[DomainFractionsKey]), &f) != nil {
		return nil
	}
	return f
}

// DomainBudget is one domain value that applies to a node: its pool and its budget.
type DomainBudget struct {
	Label, Value string
	GPUs, Budget int
}

// String names the domain as label=value.
func (d DomainBudget) String() string { return d.Label + "=" + d.Value }

// NodeDomains are the domain budgets a node with labels is under, in the order of domains: one
// per domain label the node has and the Counter counted GPUs for. A node without the label, or
// whose value was not counted, is not under that domain's budget.
func NodeDomains(domains []Domain, labels map[string]string, counted DomainGPUs) []DomainBudget {
	var out []DomainBudget
	for _, d := range domains {
		v, ok := labels[d.Label]
		if !ok {
			continue
		}
		n := counted[d.Label][v]
		if n <= 0 {
			continue
		}
		out = append(out, DomainBudget{Label: d.Label, Value: v, GPUs: n, Budget: Budget(d.MaxFraction, n)})
	}
	return out
}

// domainCount is the Counter's tally of one count: GPUs per label and value.
type domainCount struct {
	gpus DomainGPUs
}

func (c *domainCount) add(labels []string, nodeLabels map[string]string, gpus int) {
	if gpus <= 0 {
		return
	}
	for _, l := range labels {
		v, ok := nodeLabels[l]
		if !ok {
			continue
		}
		if c.gpus == nil {
			c.gpus = DomainGPUs{}
		}
		if c.gpus[l] == nil {
			c.gpus[l] = map[string]int{}
		}
		c.gpus[l][v] += gpus
	}
}

// capped keeps at most limit values, the first in the order of label and value, and returns
// how many it dropped.
func (c *domainCount) capped(labels []string, limit int) (DomainGPUs, int) {
	out, kept, dropped := DomainGPUs{}, 0, 0
	for _, l := range slices.Sorted(slices.Values(labels)) {
		values := c.gpus[l]
		out[l] = map[string]int{}
		for _, v := range slices.Sorted(maps.Keys(values)) {
			if kept >= limit {
				dropped++
				continue
			}
			out[l][v] = values[v]
			kept++
		}
	}
	return out, dropped
}

// encodeDomains is the ConfigMap's data for the domains: the counts, the fractions and what
// was dropped.
func encodeDomains(gpus DomainGPUs, domains []Domain, dropped int) map[string]string {
	counts, _ := json.Marshal(gpus) // maps of strings and ints always marshal
	fractions := map[string]float64{}
	for _, d := range domains {
		fractions[d.Label] = d.MaxFraction
	}
	f, _ := json.Marshal(fractions)
	out := map[string]string{DomainGPUsKey: string(counts), DomainFractionsKey: string(f)}
	if dropped > 0 {
		out[DomainValuesDroppedKey] = strconv.Itoa(dropped)
	}
	return out
}

// setDomainData writes the domain keys of want into data (want nil: removes them) and reports
// whether that changed data.
func setDomainData(data, want map[string]string) bool {
	changed := false
	for _, k := range []string{DomainGPUsKey, DomainFractionsKey, DomainValuesDroppedKey} {
		v, ok := want[k]
		old, had := data[k]
		switch {
		case ok && (!had || old != v):
			data[k], changed = v, true
		case !ok && had:
			delete(data, k)
			changed = true
		}
	}
	return changed
}
