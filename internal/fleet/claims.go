package fleet

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// A pod that holds GPUs through ResourceClaims names no card on itself: its claims' allocations
// name DRA devices (driver, pool, device), and the driver's ResourceSlices say which GPU each
// device is. ClaimCards follows that chain for whole objects (`gpuhealth fleet`); the continuous
// judge keeps only its links (ClaimDevices of each claim, SliceGPUs of each slice) and joins them
// with HoldClaims.

// ClaimCards returns the GPUs each pod holds through its ResourceClaims (the claims of its
// namespace it names, spec or status), by "namespace/name", leaving out pods that hold none:
// the allocated devices of driver, each the GPU its slice's UUID attribute names (a MIG device
// its parent GPU's). A claim shared by pods counts for each.
func ClaimCards(pods []corev1.Pod, claims []resourceapi.ResourceClaim, rslices []resourceapi.ResourceSlice, driver string, attrs dra.Attributes) map[string][]string {
	byClaim := make(map[string][]dra.DeviceID, len(claims))
	for i := range claims {
		c := &claims[i]
		byClaim[c.Namespace+"/"+c.Name] = ClaimDevices(c, driver)
	}
	ptrs := make([]*resourceapi.ResourceSlice, len(rslices))
	for i := range rslices {
		ptrs[i] = &rslices[i]
	}
	devices := SliceGPUs(ptrs, driver, attrs)
	out := map[string][]string{}
	for i := range pods {
		p := &pods[i]
		wp := WorkloadPod{Namespace: p.Namespace, Claims: dra.PodClaimNames(p)}
		if gpus := claimGPUs(wp, byClaim, devices); len(gpus) > 0 {
			out[p.Namespace+"/"+p.Name] = gpus
		}
	}
	return out
}

// ClaimDevices returns the devices of driver that c is allocated, nil while it is not.
func ClaimDevices(c *resourceapi.ResourceClaim, driver string) []dra.DeviceID {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []dra.DeviceID
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == driver {
			out = append(out, dra.DeviceID{Pool: r.Pool, Device: r.Device})
		}
	}
	return out
}

// SliceGPUs returns the physical GPU of each device of driver in slices (the newest generation of
// each pool, as the scheduler reads them): the UUID that the device's UUID attribute names, or
// for a MIG device the one its parent UUID attribute names. A device naming neither (a VFIO
// device names its own UUID, not the GPU's: counted as that) is left out.
//
// dra.Catalog is the one reader of those attributes (bare or qualified names, bad values,
// generations): it is asked about every string the devices carry, and answers which of them
// reach a device as its own UUID or as its parent GPU's.
func SliceGPUs(rslices []*resourceapi.ResourceSlice, driver string, attrs dra.Attributes) map[dra.DeviceID]string {
	byNode := map[string][]*resourceapi.ResourceSlice{}
	for _, s := range rslices {
		if s != nil && s.Spec.Driver == driver && s.Spec.NodeName != nil {
			byNode[*s.Spec.NodeName] = append(byNode[*s.Spec.NodeName], s)
		}
	}
	out := map[dra.DeviceID]string{}
	for node, list := range byNode {
		catalog, _ := dra.NewCatalog(list, node, driver, attrs)
		parent := map[dra.DeviceID]string{}
		for _, s := range list {
			for i := range s.Spec.Devices {
				dev := &s.Spec.Devices[i]
				key := dra.DeviceID{Pool: s.Spec.Pool.Name, Device: dev.Name}
				if !catalog.Known(key) {
					continue // an older generation
				}
				for _, a := range dev.Attributes {
					if a.StringValue == nil {
						continue
					}
					for _, t := range catalog.Targets(health.Device{UUID: *a.StringValue}) {
						switch {
						case t.DeviceID != key:
						case t.Own && out[key] == "":
							out[key] = *a.StringValue
						case !t.Own:
							parent[key] = *a.StringValue
						}
					}
				}
			}
		}
		for k, v := range parent {
			out[k] = v
		}
	}
	return out
}

// HoldClaims returns pods with, for each that names ResourceClaims, the GPUs they hold
// (WorkloadPod.ClaimGPUs): claims are the devices each claim is allocated ("namespace/name" →
// ClaimDevices), devices the GPU each device is (SliceGPUs). pods itself is not changed.
func HoldClaims(pods []WorkloadPod, claims map[string][]dra.DeviceID, devices map[dra.DeviceID]string) []WorkloadPod {
	out := make([]WorkloadPod, len(pods))
	for i, p := range pods {
		if len(p.Claims) > 0 {
			p.ClaimGPUs = claimGPUs(p, claims, devices)
		}
		out[i] = p
	}
	return out
}

// claimGPUs returns the GPUs p's claims hold, sorted and without repeats (two MIG devices of one
// GPU are that GPU).
func claimGPUs(p WorkloadPod, claims map[string][]dra.DeviceID, devices map[dra.DeviceID]string) []string {
	var out []string
	for _, name := range p.Claims {
		for _, d := range claims[p.Namespace+"/"+name] {
			if uuid, ok := devices[d]; ok {
				out = append(out, uuid)
			}
		}
	}
	slices.SortFunc(out, strings.Compare)
	return slices.Compact(out)
}
