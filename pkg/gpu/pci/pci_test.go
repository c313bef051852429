package pci_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/pci"
)

// function writes a PCI function's vendor, device and class attributes under root and returns
// its directory.
func function(t *testing.T, root, addr, vendor, device, class string) string {
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
	return dir
}

// gpu writes an H100's attributes at addr.
func gpu(t *testing.T, root, addr string) string {
	t.Helper()
	return function(t, root, addr, "0x10de", "0x2330", "0x030200")
}

// bind links the function in dir to driver, as the kernel does.
func bind(t *testing.T, dir, driver string) {
	t.Helper()
	if err := os.Symlink("../../../../bus/pci/drivers/"+driver, filepath.Join(dir, "driver")); err != nil {
		t.Fatal(err)
	}
}

// gpus runs pci.GPUs, failing the test if it does not return: what it reads must never block.
func gpus(t *testing.T, root string) ([]pci.Function, []pci.Skipped) {
	t.Helper()
	type result struct {
		fns     []pci.Function
		skipped []pci.Skipped
		err     error
	}
	done := make(chan result, 1)
	go func() {
		fns, skipped, err := pci.GPUs(root)
		done <- result{fns, skipped, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.fns, r.skipped
	case <-time.After(time.Minute): // a guard against a hang, not a measure of speed
		t.Fatal("GPUs blocked reading sysfs")
		return nil, nil
	}
}

func addresses(fns []pci.Function) []string {
	var out []string
	for _, f := range fns {
		out = append(out, f.Address)
	}
	return out
}

func TestGPUsListsNVIDIAsDisplayAnd3DControllersOnly(t *testing.T) {
	root := t.TempDir()
	gpu(t, root, "0000:3b:00.0")                                      // H100: 3D controller
	function(t, root, "0000:1a:00.0", "0x10de", "0x20b5", "0x030000") // a VGA-class GPU
	function(t, root, "0000:3b:00.1", "0x10de", "0x22bc", "0x040300") // its audio function
	function(t, root, "0000:c0:00.0", "0x10de", "0x22a3", "0x068000") // an NVSwitch (bridge)
	function(t, root, "0000:5e:00.0", "0x15b3", "0x101d", "0x020700") // a Mellanox NIC
	function(t, root, "0000:7f:00.0", "0x10de", "0x2330", "")         // class unreadable: not known to be a GPU
	function(t, root, "0000:80:00.0", "0x10de", "0x2330", "garbage")
	function(t, root, "not-an-address", "0x10de", "0x2330", "0x030200")
	got, skipped := gpus(t, root)
	if want := []string{"0000:1a:00.0", "0000:3b:00.0"}; !slices.Equal(addresses(got), want) {
		t.Fatalf("GPUs = %v, want %v", addresses(got), want)
	}
	if got[1].Device != 0x2330 || got[1].Class != 0x030200 {
		t.Errorf("function %+v", got[1])
	}
	var skippedAt []string
	for _, s := range skipped {
		skippedAt = append(skippedAt, s.Address)
	}
	if want := []string{"0000:7f:00.0", "0000:80:00.0"}; !slices.Equal(skippedAt, want) {
		t.Errorf("skipped %v, want %v", skipped, want)
	}
}

func TestGPUsNamesTheDriverEachGPUIsBoundTo(t *testing.T) {
	root := t.TempDir()
	bind(t, gpu(t, root, "0000:1a:00.0"), "nvidia")
	bind(t, gpu(t, root, "0000:3b:00.0"), "vfio-pci") // passed through to a virtual machine
	gpu(t, root, "0000:5e:00.0")                      // unbound: NVIDIA's driver failed to bind it
	got, skipped := gpus(t, root)
	if len(skipped) != 0 {
		t.Fatalf("skipped %v", skipped)
	}
	want := []struct {
		driver string
		other  bool
	}{{"nvidia", false}, {"vfio-pci", true}, {"", false}}
	if len(got) != len(want) {
		t.Fatalf("GPUs = %+v", got)
	}
	for i, w := range want {
		if got[i].Driver != w.driver || got[i].OtherDriver() != w.other {
			t.Errorf("%s: driver %q, other %t; want %q, %t", got[i].Address, got[i].Driver, got[i].OtherDriver(), w.driver, w.other)
		}
	}
}

// TestGPUsReadsOnlySmallRegularFiles: sysfs is a host path mounted into the agent's container,
// and what sits there is not always the kernel's. A FIFO as vendor blocked the agent's start for
// good; a link was followed wherever it led.
func TestGPUsReadsOnlySmallRegularFiles(t *testing.T) {
	fifo := func(path string) error { return syscall.Mkfifo(path, 0o644) }
	dir := func(path string) error { return os.Mkdir(path, 0o755) }
	for _, tc := range []struct {
		name string
		// plant puts something else in place of the GPU's entry (vendor, class, driver).
		entry string
		plant func(path string) error
		want  error
		says  string
	}{
		{name: "a FIFO as vendor", entry: "vendor", plant: fifo, want: pci.ErrNotRegular, says: "vendor: a FIFO"},
		{name: "a FIFO as class", entry: "class", plant: fifo, want: pci.ErrNotRegular, says: "class: a FIFO"},
		{
			name: "a link as vendor, even to a good value", entry: "vendor",
			plant: func(path string) error { return os.Symlink("../0000:1a:00.0/vendor", path) },
			want:  pci.ErrNotRegular, says: "vendor: a symbolic link",
		},
		{name: "a directory as vendor", entry: "vendor", plant: dir, want: pci.ErrNotRegular, says: "vendor: a directory"},
		{
			name: "a vendor larger than an attribute", entry: "vendor",
			plant: func(path string) error { return os.WriteFile(path, []byte("0x10de"+strings.Repeat(" ", 1<<20)), 0o644) },
			want:  pci.ErrTooLarge, says: "vendor: larger than 32 bytes",
		},
		{name: "a driver that is no link", entry: "driver", plant: dir, says: "driver: readlink"},
		{
			name: "a driver link that names no driver", entry: "driver",
			plant: func(path string) error {
				return os.Symlink("../../../../bus/pci/drivers/"+strings.Repeat("x", 200), path)
			},
			says: "driver: the link names no driver",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			gpu(t, root, "0000:1a:00.0")
			path := filepath.Join(gpu(t, root, "0000:3b:00.0"), tc.entry)
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			if err := tc.plant(path); err != nil {
				t.Fatal(err)
			}
			got, skipped := gpus(t, root)
			if want := []string{"0000:1a:00.0"}; !slices.Equal(addresses(got), want) {
				t.Errorf("GPUs = %v, want %v", addresses(got), want)
			}
			if len(skipped) != 1 || skipped[0].Address != "0000:3b:00.0" {
				t.Fatalf("skipped %v, want 0000:3b:00.0", skipped)
			}
			err := skipped[0].Err
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("reason %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("reason %q, want it to say %q", err, tc.says)
			}
		})
	}
}

func TestGPUsReadsAnAttributeUpToTheLimit(t *testing.T) {
	root := t.TempDir()
	dir := gpu(t, root, "0000:3b:00.0")
	padded := "0x10de" + strings.Repeat(" ", pci.MaxAttribute-len("0x10de"))
	if err := os.WriteFile(filepath.Join(dir, "vendor"), []byte(padded), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, skipped := gpus(t, root); len(got) != 1 || len(skipped) != 0 {
		t.Errorf("a vendor of exactly %d bytes: GPUs %v, skipped %v", pci.MaxAttribute, got, skipped)
	}
}

func TestGPUsWithoutSysfs(t *testing.T) {
	_, _, err := pci.GPUs(filepath.Join(t.TempDir(), "none"))
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
