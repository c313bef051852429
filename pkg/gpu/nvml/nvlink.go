package nvml

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvlinkCounters are the error counters summed per link.
var nvlinkCounters = []nvml.NvLinkErrorCounter{
	nvml.NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_CRC_FLIT, nvml.NVLINK_ERROR_DL_CRC_DATA,
}

// readNVLinks reads the links found on the first round. A GPU without NVLink answers
// NOT_SUPPORTED for link 0; links past the last answer INVALID_ARGUMENT.
func (b *Backend) readNVLinks(g *gpu, rd reader) error {
	if rd.off(g, ReadingNVLink) {
		return nil
	}
	links, err := b.scanNVLinks(g, rd)
	if err != nil || links == nil {
		return err
	}
	if len(links) == 0 {
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

// scanNVLinks returns the GPU's links, finding them on the first call. It returns nil (not an
// empty list) when the scan failed and is to be tried again next round.
func (b *Backend) scanNVLinks(g *gpu, rd reader) ([]int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.linksScanned {
		return g.links, nil
	}
	g.links = []int{}
	for link := range nvml.NVLINK_MAX_LINKS {
		_, ret := g.handle.GetNvLinkState(link)
		switch {
		case ret == nvml.SUCCESS:
			g.links = append(g.links, link)
			continue
		case notSupported(ret) && link > 0:
			continue // a disabled link on a GPU that has others
		case notSupported(ret), ret == nvml.ERROR_INVALID_ARGUMENT:
		default:
			// Try again next round rather than decide on an error.
			_, err := rd.check(ReadingNVLink, ret)
			return nil, err
		}
		break
	}
	g.linksScanned = true
	return g.links, nil
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
		case notSupported(ret):
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
