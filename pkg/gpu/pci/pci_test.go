package pci_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/pci"
)

// function writes a PCI function's vendor, device and class attributes under root.
func function(t *testing.T, root, addr, vendor, device, class string) {
	t.Helper()
	dir := filepath.Join(root, "bus", "pci", "devices", addr)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"vendor": vendor, "device": device, "class": class} {
		if v == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGPUsListsNVIDIAsDisplayAnd3DControllersOnly(t *testing.T) {
	root := t.TempDir()
	function(t, root, "0000:3b:00.0", "0x10de", "0x2330", "0x030200") // H100: 3D controller
	function(t, root, "0000:1a:00.0", "0x10de", "0x20b5", "0x030000") // a VGA-class GPU
	function(t, root, "0000:3b:00.1", "0x10de", "0x22bc", "0x040300") // its audio function
	function(t, root, "0000:c0:00.0", "0x10de", "0x22a3", "0x068000") // an NVSwitch (bridge)
	function(t, root, "0000:5e:00.0", "0x15b3", "0x101d", "0x020700") // a Mellanox NIC
	function(t, root, "0000:7f:00.0", "0x10de", "0x2330", "")         // class unreadable: not known to be a GPU
	function(t, root, "0000:80:00.0", "0x10de", "0x2330", "garbage")
	function(t, root, "not-an-address", "0x10de", "0x2330", "0x030200")
	got, err := pci.GPUs(root)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, f := range got {
		addrs = append(addrs, f.Address)
	}
	if want := []string{"0000:1a:00.0", "0000:3b:00.0"}; !slices.Equal(addrs, want) {
		t.Fatalf("GPUs = %v, want %v", addrs, want)
	}
	if got[1].Device != 0x2330 || got[1].Class != 0x030200 {
		t.Errorf("function %+v", got[1])
	}
}

func TestGPUsWithoutSysfs(t *testing.T) {
	_, err := pci.GPUs(filepath.Join(t.TempDir(), "none"))
	if err == nil || !pci.IsNotExist(err) {
		t.Errorf("GPUs without sysfs = %v, want a not-exist error", err)
	}
}

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"3b:00.0":          "0000:3b:00.0",
		"00000001:3B:00.0": "0001:3b:00.0",
		" 0000:3B:00.0\n":  "0000:3b:00.0",
	} {
		if got, ok := pci.Normalize(in); !ok || got != want {
			t.Errorf("Normalize(%q) = %q, %t; want %q", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "GPU-1", "0000:3b:00.8", "1000000000:3b:00.0", "0000:3g:00.0", "0000:3b:00"} {
		if got, ok := pci.Normalize(bad); ok {
			t.Errorf("Normalize(%q) = %q, want refused", bad, got)
		}
	}
}
