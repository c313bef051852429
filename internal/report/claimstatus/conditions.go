package claimstatus

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// desired returns, for each device of this node the claim holds whose GPU is not Healthy, the
// condition it should carry.
func (s *Syncer) desired(claim *resourceapi.ResourceClaim, assigned map[dra.DeviceID]dra.Assignment) map[dra.DeviceID]metav1.Condition {
	out := map[dra.DeviceID]metav1.Condition{}
	if claim.Status.Allocation == nil {
		return out
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != s.opts.Driver {
			continue
		}
		key := dra.DeviceID{Pool: r.Pool, Device: r.Device}
		if a, ok := assigned[key]; ok {
			out[key] = condition(a.Status)
		}
	}
	return out
}

func condition(d health.DeviceStatus) metav1.Condition {
	reason := ReasonDegraded
	if d.Health == health.Unhealthy {
		reason = ReasonUnhealthy
	}
	var parts []string
	for _, c := range health.WorstFirst(d.Conditions) {
		parts = append(parts, c.Reason+": "+c.Message)
	}
	msg := strings.Join(parts, "; ")
	if d.Evict {
		msg += "; eviction requested"
	}
	if len(msg) > 32*1024 {
		msg = msg[:32*1024]
	}
	return metav1.Condition{Type: ConditionType, Status: metav1.ConditionFalse, Reason: reason, Message: msg}
}

// current returns our conditions now in the claim's status, for this node's devices.
func current(claim *resourceapi.ResourceClaim, mine func(dra.DeviceID) bool, driver string) map[dra.DeviceID]metav1.Condition {
	out := map[dra.DeviceID]metav1.Condition{}
	for _, ds := range claim.Status.Devices {
		key := dra.DeviceID{Pool: ds.Pool, Device: ds.Device}
		if !mine(key) || ds.Driver != driver {
			continue
		}
		for _, c := range ds.Conditions {
			if c.Type == ConditionType {
				out[key] = c
			}
		}
	}
	return out
}

func hasOurConditions(claim *resourceapi.ResourceClaim) bool {
	for _, ds := range claim.Status.Devices {
		if slices.ContainsFunc(ds.Conditions, func(c metav1.Condition) bool { return c.Type == ConditionType }) {
			return true
		}
	}
	return false
}

func (s *Syncer) differs(claim *resourceapi.ResourceClaim, catalog *dra.Catalog, desired map[dra.DeviceID]metav1.Condition) bool {
	have := current(claim, catalog.Known, s.opts.Driver)
	if len(have) != len(desired) {
		return true
	}
	for key, want := range desired {
		got, ok := have[key]
		if !ok || got.Status != want.Status || got.Reason != want.Reason || got.Message != want.Message {
			return true
		}
	}
	return false
}

// apply writes every condition of the claim's devices on this node in one server-side apply;
// devices left out (all of them, on recovery) lose what this field manager owned, and server-side
// apply removes the entries nobody else owns.
func (s *Syncer) apply(ctx context.Context, claim *resourceapi.ResourceClaim, desired map[dra.DeviceID]metav1.Condition) error {
	have := current(claim, func(dra.DeviceID) bool { return true }, s.opts.Driver)
	keys := make([]dra.DeviceID, 0, len(desired))
	for k := range desired {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b dra.DeviceID) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Device, b.Device))
	})
	now := metav1.NewTime(s.opts.Clock.Now())
	body := claimStatusApply{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim"}
	body.Metadata.Name, body.Metadata.Namespace = claim.Name, claim.Namespace
	for _, k := range keys {
		want := desired[k]
		since := now
		if got, ok := have[k]; ok && got.Status == want.Status {
			since = got.LastTransitionTime
		}
		body.Status.Devices = append(body.Status.Devices, deviceStatusApply{
			Driver: s.opts.Driver, Pool: k.Pool, Device: k.Device,
			Conditions: []conditionApply{{
				Type: want.Type, Status: want.Status, Reason: want.Reason, Message: want.Message,
				LastTransitionTime: since, ObservedGeneration: claim.Generation,
			}},
		})
	}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	_, err = s.client.ResourceV1().ResourceClaims(claim.Namespace).Patch(ctx, claim.Name, types.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: FieldManager, Force: ptr.To(true)}, "status")
	return err
}

// claimStatusApply is the server-side apply configuration of a claim's device conditions, the
// fields client-go's ResourceClaim apply configuration would send (that package links every API
// group; see package kube).
type claimStatusApply struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Status struct {
		Devices []deviceStatusApply `json:"devices,omitempty"`
	} `json:"status"`
}

type deviceStatusApply struct {
	Driver     string           `json:"driver"`
	Pool       string           `json:"pool"`
	Device     string           `json:"device"`
	Conditions []conditionApply `json:"conditions"`
}

type conditionApply struct {
	Type               string                 `json:"type"`
	Status             metav1.ConditionStatus `json:"status"`
	ObservedGeneration int64                  `json:"observedGeneration"`
	LastTransitionTime metav1.Time            `json:"lastTransitionTime"`
	Reason             string                 `json:"reason"`
	Message            string                 `json:"message"`
}
