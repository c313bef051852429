package controlplane

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestContainerdNodeConfig(t *testing.T) {
	n := &KubeletNode{Name: "n", IP: netip.MustParseAddr("198.51.100.7"), Dir: "/nodes/n"}
	if got, want := n.PodCIDR().String(), "10.244.7.0/24"; got != want {
		t.Errorf("pod CIDR %s, want %s", got, want)
	}
	if !netip.MustParsePrefix(PodNetworkPrefix).Contains(n.PodCIDR().Addr()) {
		t.Errorf("pod CIDR %s outside %s", n.PodCIDR(), PodNetworkPrefix)
	}

	var cni struct {
		Plugins []struct {
			Type, Bridge string
			IsGateway    bool
			IPMasq       bool
			IPAM         struct {
				Type   string
				Ranges [][]struct{ Subnet string }
			}
		}
	}
	if err := json.Unmarshal([]byte(n.cniConfig()), &cni); err != nil {
		t.Fatalf("CNI configuration: %v\n%s", err, n.cniConfig())
	}
	if len(cni.Plugins) != 1 {
		t.Fatalf("%d CNI plugins, want the bridge", len(cni.Plugins))
	}
	p := cni.Plugins[0]
	if p.Type != "bridge" || p.Bridge != "gh-br7" || !p.IsGateway || p.IPMasq || p.IPAM.Type != "host-local" ||
		len(p.IPAM.Ranges) != 1 || len(p.IPAM.Ranges[0]) != 1 || p.IPAM.Ranges[0][0].Subnet != "10.244.7.0/24" {
		t.Errorf("CNI plugin %+v, want bridge gh-br7 as gateway without masquerading, host-local 10.244.7.0/24", p)
	}
	if len(p.Bridge) > 15 {
		t.Errorf("bridge name %q is longer than an interface name may be", p.Bridge)
	}

	cfg := n.containerdConfig()
	for _, want := range []string{
		`address = "/nodes/n/cri.sock"`,
		`root = "/nodes/n/containerd/root"`,
		`state = "/run/containerd"`,
		`path = "/nodes/n/containerd/opt"`,
		`sandbox = "` + PauseImage + `"`,
		"restrict_oom_score_adj = true",
		"netns_mounts_under_state_dir = true",
		`bin_dirs = ["/usr/lib/cni"]`,
		`conf_dir = "/nodes/n/containerd/cni"`,
		"SystemdCgroup = false",
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("containerd configuration lacks %s:\n%s", want, cfg)
		}
	}
}

func TestParseCRICgroupIDs(t *testing.T) {
	cases := []struct {
		name, data string
		want       []string
	}{
		{"cgroup v1, one container", "12:pids:/k8s.io/abc\n11:cpu,cpuacct:/k8s.io/abc\n1:name=systemd:/k8s.io/abc\n", []string{"abc"}},
		{"cgroup v2", "0::/k8s.io/def\n", []string{"def"}},
		{"outside the CRI's cgroups", "12:pids:/user.slice\n0::/\n", nil},
		{"deeper than a container", "4:memory:/k8s.io/abc/sub\n", nil},
		{"a cgroup merely named like it", "4:memory:/x/k8s.io/abc\n", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseCRICgroupIDs(tc.data); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
