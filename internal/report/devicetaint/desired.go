package devicetaint

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"regexp"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// RuleName is the DeviceTaintRule name of node's GPU or MIG device uuid: gpuhealth-<node>-<uuid>.
// Names are cluster-wide, so they carry the node: with the UUID alone, another node's agent could
// take a GPU's name first and keep its rule from ever being written. The admission policy lets an
// agent create only rules under its own node's prefix (RulePrefix). A name too long for an object
// name ends in a hash of the UUID instead.
func RuleName(node, uuid string) string {
	name := RulePrefix(node) + strings.Trim(invalidName.ReplaceAllString(strings.ToLower(uuid), "-"), "-")
	if len(name) > maxRuleName || len(validation.IsDNS1123Subdomain(name)) > 0 {
		name = RulePrefix(node) + hash(uuid)
	}
	return name
}

// RulePrefix starts the name of every rule of node's agent.
func RulePrefix(node string) string {
	if len(node) > MaxPrefixedNode {
		return "gpuhealth-" + hash(node) + "-"
	}
	return "gpuhealth-" + node + "-"
}

// MaxPrefixedNode is the longest node name a rule name carries whole, leaving room for a hash of
// the UUID (the admission policy knows the same number).
const MaxPrefixedNode = maxRuleName - len("gpuhealth--") - 8

// maxRuleName leaves room for the random suffix of a rule created under another name when a
// foreign object holds its own (see Syncer.create).
const maxRuleName = validation.DNS1123SubdomainMaxLength - 6

// KeyAnnotation holds a rule's own name (RuleName, or the name after it for a device reached
// through its GPU) on a rule that had to be created under another: the syncer matches rules to
// devices by it.
const KeyAnnotation = "gpuhealth.dev/rule-key"

// ruleKey is the name a rule stands for: its KeyAnnotation, else its name.
func ruleKey(r *resourceapi.DeviceTaintRule) string {
	if k := r.Annotations[KeyAnnotation]; k != "" {
		return k
	}
	return r.Name
}

var invalidName = regexp.MustCompile(`[^a-z0-9-]+`)

// desired returns the rules this node should have for snap, by name: the node's devices as the
// slice cache has them now, matched to the GPUs that are not Healthy.
func (s *Syncer) desired(ctx context.Context, snap health.Snapshot) (map[string]*resourceapi.DeviceTaintRule, error) {
	if err := s.ensureNodeRef(ctx); err != nil {
		return nil, err
	}
	catalog, err := s.devices.Catalog(ctx)
	if err != nil {
		return nil, err
	}
	return s.desiredRules(ctx, snap, catalog), nil
}

// desiredRules returns the rules this node should have for snap: one per DRA device that a GPU
// or MIG device which is not Healthy applies to (see dra.Catalog.Assign). The rule of a
// device's own GPU or MIG device is named RuleName(uuid); a device reached through its parent
// GPU or PCI address (a MIG partition, a VFIO device) gets the device's name after that. Names
// depend only on the devices, never on the order the cache lists them in, so an unchanged state
// never rewrites a rule.
func (s *Syncer) desiredRules(ctx context.Context, snap health.Snapshot, catalog *dra.Catalog) map[string]*resourceapi.DeviceTaintRule {
	assigned, unmatched := catalog.Assign(snap)
	s.reportUnmatched(ctx, snap, unmatched)
	devs := slices.SortedFunc(maps.Keys(assigned), func(a, b dra.DeviceID) int {
		if oa, ob := assigned[a].Own, assigned[b].Own; oa != ob {
			if oa {
				return -1
			}
			return 1
		}
		return cmp.Or(strings.Compare(a.Pool, b.Pool), strings.Compare(a.Device, b.Device))
	})
	desired := make(map[string]*resourceapi.DeviceTaintRule, len(devs))
	for _, dev := range devs {
		a := assigned[dev]
		name := RuleName(s.nodeName, a.Status.Device.UUID)
		if _, taken := desired[name]; !a.Own || taken {
			name = deviceRuleName(name, dev, s.nodeName)
		}
		if _, taken := desired[name]; taken {
			continue // cannot happen with valid device names; the first device keeps the name
		}
		desired[name] = s.rule(name, a.Status, dev)
	}
	return desired
}

// deviceRuleName is base followed by the device's name, and its pool's when that is not the
// node's. Device names are DNS labels; a pool name may hold characters a rule name cannot, so
// a hash of it keeps two pools apart. Every name keeps base's node prefix.
func deviceRuleName(base string, dev dra.DeviceID, node string) string {
	name := base + "-" + dev.Device
	if dev.Pool != node {
		name = base + "-" + strings.Trim(invalidName.ReplaceAllString(strings.ToLower(dev.Pool), "-"), "-") + "-" + dev.Device + "-" + hash(dev.Pool)
	}
	if len(name) > maxRuleName || len(validation.IsDNS1123Subdomain(name)) > 0 {
		name = base + "-" + hash(dev.Pool+"/"+dev.Device)
	}
	if len(name) > maxRuleName {
		name = RulePrefix(node) + hash(base+"/"+dev.Pool+"/"+dev.Device)
	}
	return name
}

func hash(s string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return fmt.Sprintf("%08x", h.Sum32())
}

// reportUnmatched calls Options.Unmatched, once per device and state, for the devices that are
// not Healthy and have no DRA device to taint, and logs why.
func (s *Syncer) reportUnmatched(ctx context.Context, snap health.Snapshot, unmatched []health.DeviceStatus) {
	logger := klog.FromContext(ctx)
	none := make(map[string]bool, len(unmatched))
	for _, d := range unmatched {
		none[d.Device.UUID] = true
	}
	for _, d := range snap.Devices {
		uuid := d.Device.UUID
		// A missing GPU has no DRA device by definition; nothing to say about it here.
		if d.Health == health.Healthy || !none[uuid] || d.Device.Missing {
			delete(s.reported, uuid)
			continue
		}
		if prev, ok := s.reported[uuid]; ok && prev == d.Health {
			continue
		}
		s.reported[uuid] = d.Health
		why := fmt.Sprintf("no device of driver %s on this node carries %s=%s", s.opts.Driver, s.opts.UUIDAttribute, uuid)
		if d.Device.MIG != nil {
			why += " (dynamic MIG partitions carry no MIG UUID, so the slices do not say which partition a MIG instance is)"
		} else {
			why += fmt.Sprintf(", %s=%s or %s=%s", s.opts.ParentUUIDAttribute, uuid, s.opts.PCIBusIDAttribute, d.Device.PCIBusID)
		}
		logger.Info("GPU is not Healthy but has no DRA device to taint", "gpu", uuid, "index", d.Device.Index, "health", d.Health, "reason", why)
		if s.opts.Unmatched != nil {
			s.opts.Unmatched(d)
		}
	}
}

func (s *Syncer) rule(name string, d health.DeviceStatus, t dra.DeviceID) *resourceapi.DeviceTaintRule {
	key, value := dra.TaintKeyValue(d)
	driver, pool, device := s.opts.Driver, t.Pool, t.Device
	return &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{KeyAnnotation: name},
			Labels: map[string]string{
				NodeLabel:      s.nodeName,
				UUIDLabel:      dra.LabelValue(d.Device.UUID),
				ManagedByLabel: ManagedBy,
			},
			OwnerReferences: []metav1.OwnerReference{*s.nodeRef},
		},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: &driver, Pool: &pool, Device: &device},
			Taint:          resourceapi.DeviceTaint{Key: key, Value: value, Effect: dra.TaintEffect(d, s.opts.NoExecute)},
		},
	}
}

// ensureNodeRef reads the Node for the owner reference every rule carries.
func (s *Syncer) ensureNodeRef(ctx context.Context) error {
	// The Node is read again with every relist: a Node deleted and registered again (a new UID)
	// would otherwise leave the rules owned by the old one, which the garbage collector deletes.
	if s.nodeRef != nil && s.fresh && s.opts.Clock.Since(s.listed) < s.opts.Relist {
		return nil
	}
	node, err := s.client.CoreV1().Nodes().Get(ctx, s.nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", s.nodeName, err)
	}
	s.nodeRef = &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
	return nil
}
