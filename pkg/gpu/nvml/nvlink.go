package nvml

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvlinkCounters are the error counters summed per link. Hopper counts receive errors in
// NVML_NVLINK_ERROR_DL_ECC_DATA where older GPUs count CRC errors; a GPU without a counter
// answers NOT_SUPPORTED for it: no data.
var nvlinkCounters = []nvml.NvLinkErrorCounter{
	nvml.NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_CRC_FLIT, nvml.NVLINK_ERROR_DL_CRC_DATA,
	nvml.NVLINK_ERROR_DL_ECC_DATA,
}

// readNVLinks reads the state and error counters of the links that count (see trackedLinks).
func (b *Backend) readNVLinks(g *gpu, rd reader) error {
	if rd.off(g, ReadingNVLink) {
		return nil
	}
	links, pending, err := b.trackedLinks(g, rd)
	switch {
	case err != nil || links == nil:
		return err
	case pending:
		rd.r.NVLinkFabricPending = true
		return nil
	case len(links) == 0:
		rd.r.Unsupported = append(rd.r.Unsupported, ReadingNVLink)
		return nil
	}
	for _, link := range links {
		state, ret := g.handle.GetNvLinkState(link)
		ok, err := rd.check(fmt.Sprintf("%s%d", ReadingNVLink, link), ret)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		l := NVLinkReading{Link: link, Down: state != nvml.FEATURE_ENABLED}
		if l.Errors, err = b.nvlinkErrors(g, link, rd); err != nil {
			return err
		}
		rd.r.NVLinks = append(rd.r.NVLinks, l)
	}
	return nil
}

// trackedLinks returns the links whose state counts: those active (NVML_FEATURE_ENABLED) when
// they are first scanned. nvml.h's NVML_FEATURE_DISABLED only says a link is inactive: a link
// that never was (a card without bridges, a passthrough VM) is no fault, and is not watched; a
// watched link that goes inactive is. With an expected link count (WithExpectedNVLinks), links 0
// to n-1 that NVML has are watched whatever their state: an expected link inactive from boot is
// reported down. On a GPU of an NVLink fabric whose Fabric Manager has not finished with it, no
// link is trained yet: pending is true and no link counts until the fabric state (this round's,
// read by readFabric) is COMPLETED, when the links active then (and the expected ones) are
// watched. Without fabric information a link that comes up later is watched from the next agent
// start. links is nil (not empty) when the scan failed and is to be tried again next round.
func (b *Backend) trackedLinks(g *gpu, rd reader) (links []int, pending bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.linksScanned && !g.fabricPending {
		return g.links, false, nil
	}
	if rd.r.Fabric.waiting() {
		if !g.fabricPending {
			b.log.Info("NVLinks not watched until Fabric Manager has registered the GPU", "gpu", g.dev.UUID)
		}
		g.links, g.linksScanned, g.fabricPending = []int{}, true, true
		return g.links, true, nil
	}
	active, inactive, ok, err := b.scanNVLinks(g, rd)
	if !ok {
		return nil, false, err
	}
	if g.fabricPending {
		b.log.Info("Fabric Manager has registered the GPU: watching its active NVLinks", "gpu", g.dev.UUID, "watched", active)
	}
	watched := active
	if n := b.opts.expectedNVLinks; n > 0 {
		var dead, ignored []int
		for _, l := range inactive {
			if l < n {
				dead = append(dead, l)
			} else {
				ignored = append(ignored, l)
			}
		}
		watched = slices.Sorted(slices.Values(append(slices.Clone(active), dead...)))
		if len(dead) > 0 {
			b.log.Info("Expected NVLinks inactive when first scanned: watched, and reported down until they come up", "gpu", g.dev.UUID, "expected", n, "links", dead)
		}
		if have := len(active) + len(inactive); have < n {
			b.log.Info("The GPU has fewer NVLinks than expected: the missing ones cannot be watched", "gpu", g.dev.UUID, "expected", n, "links", have)
		}
		inactive = ignored
	}
	if len(inactive) > 0 {
		b.log.Info("NVLinks inactive when first scanned are not watched", "gpu", g.dev.UUID, "links", inactive, "watched", watched)
	}
	g.links, g.linksScanned, g.fabricPending = watched, true, false
	return g.links, false, nil
}

// scanNVLinks asks every link for its state: links until NVML answers INVALID_ARGUMENT; a GPU
// whose link 0 answers NOT_SUPPORTED has no NVLink. ok is false when the scan failed and is to
// be tried again next round.
func (b *Backend) scanNVLinks(g *gpu, rd reader) (active, inactive []int, ok bool, err error) {
	active = []int{}
	for link := range nvml.NVLINK_MAX_LINKS {
		state, ret := g.handle.GetNvLinkState(link)
		switch {
		case ret == nvml.SUCCESS && state == nvml.FEATURE_ENABLED:
			active = append(active, link)
			continue
		case ret == nvml.SUCCESS:
			inactive = append(inactive, link)
			continue
		case notSupported(ret) && link > 0:
			continue // a link this GPU does not have, on a GPU that has others
		case notSupported(ret), ret == nvml.ERROR_INVALID_ARGUMENT:
		default:
			// Try again next round rather than decide on an error.
			_, err := rd.check(ReadingNVLink, ret)
			return nil, nil, false, err
		}
		break
	}
	return active, inactive, true, nil
}

// nvlinkErrors sums the link's error counters; nil when none is supported (or the driver lacks
// the call).
func (b *Backend) nvlinkErrors(g *gpu, link int, rd reader) (*uint64, error) {
	if !b.sym.has(symNvLinkErrorCounter) {
		return nil, nil
	}
	var total uint64
	supported := false
	for _, c := range nvlinkCounters {
		v, ret := g.handle.GetNvLinkErrorCounter(link, c)
		switch {
		case ret == nvml.SUCCESS:
			total += v
			supported = true
		case notSupported(ret), counterUnknown(c, ret):
		default:
			if err := rd.broken(fmt.Sprintf("NVLink %d error counter", link), ret); err != nil {
				return nil, err
			}
			rd.r.Errors = append(rd.r.Errors, nvmlError(fmt.Sprintf("reading NVLink %d error counter %d", link, c), ret).Error())
		}
	}
	if !supported {
		return nil, nil
	}
	return &total, nil
}

// counterUnknown reports whether a driver older than the ECC data counter refuses it as an
// invalid argument: no data, like NOT_SUPPORTED.
func counterUnknown(c nvml.NvLinkErrorCounter, ret nvml.Return) bool {
	return c == nvml.NVLINK_ERROR_DL_ECC_DATA && ret == nvml.ERROR_INVALID_ARGUMENT
}
