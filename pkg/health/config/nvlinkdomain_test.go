package config_test

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestNVLinkDomainLabel(t *testing.T) {
	c, err := config.Parse([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Agent.WithDefaults().NVLinkDomainLabel; got != "nvidia.com/gpu.clique" {
		t.Errorf("default nvlinkDomainLabel %q, want GPU feature discovery's nvidia.com/gpu.clique", got)
	}
	for _, ok := range []string{"-", "topology.kubernetes.io/rack", "rack", "example.com/nvl72-domain_1"} {
		if _, err := config.Parse([]byte(header + "agent: {nvlinkDomainLabel: " + ok + "}\n")); err != nil {
			t.Errorf("nvlinkDomainLabel %q: %v", ok, err)
		}
	}
	for _, bad := range []string{"Example.com/x", "a/b/c", "/x", "x/", "-x", strings.Repeat("a", 64), "a b"} {
		_, err := config.Parse([]byte(header + "agent: {nvlinkDomainLabel: \"" + bad + "\"}\n"))
		if err == nil || !strings.Contains(err.Error(), "agent.nvlinkDomainLabel") {
			t.Errorf("nvlinkDomainLabel %q: error %v, want one naming agent.nvlinkDomainLabel", bad, err)
		}
	}
}
