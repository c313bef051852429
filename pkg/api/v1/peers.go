package v1

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// PeerFaults are the XID faults a peer node reports on its GPUs (its HealthKey's summaries),
// as health.Tracker.SetPeerFaults takes them, sorted by GPU index then XID: the xidFaults of its
// physical GPUs that are not missing and that its own report marks Unhealthy.
//
// Another node wrote the report, so it is a claim to check: a fault that no agent could have
// written (health.PeerFault.Validate: a UUID that is not "GPU-" and a UUID, XID 0, no time) or
// that the report contradicts (a GPU it says is Healthy or Degraded has no Unhealthy XID of its
// own) is left out and named in refused, which quotes the peer's text only up to a bound and
// names the first few refusals only (health.PeerFaultErrors); nil when none was.
func PeerFaults(node string, summaries map[string]GPUSummary) (faults []health.PeerFault, refused error) {
	var errs health.PeerFaultErrors
	// In UUID order, so that the refusals named are the same for the same report.
	for _, uuid := range slices.Sorted(maps.Keys(summaries)) {
		s := summaries[uuid]
		if s.ParentUUID != "" || s.Missing {
			continue
		}
		for _, f := range s.XIDFaults {
			p := health.PeerFault{Node: node, UUID: uuid, Index: s.Index, XID: f.XID, Since: f.Since}
			if err := p.Validate(); err != nil {
				errs.Add(err)
				continue
			}
			if s.Health != health.Unhealthy.String() {
				errs.Add(fmt.Errorf("peer fault of node %s, GPU %s: XID %d on a GPU its report says is %.16q, not Unhealthy", node, uuid, f.XID, s.Health))
				continue
			}
			faults = append(faults, p)
		}
	}
	slices.SortFunc(faults, func(a, b health.PeerFault) int {
		return cmp.Or(cmp.Compare(a.Index, b.Index), cmp.Compare(a.UUID, b.UUID), cmp.Compare(a.XID, b.XID))
	})
	return faults, errs.Err()
}
