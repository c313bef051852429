package nvml_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

func mkfile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestFindLibrary(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, root string)
		paths []string
		want  string // relative to root; "" wants ErrLibraryNotFound
	}{
		{"toolkit-injected", func(t *testing.T, root string) {
			mkfile(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.163.01"), "lib")
			symlink(t, "libnvidia-ml.so.550.163.01", filepath.Join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
		}, []string{"/usr/lib/x86_64-linux-gnu"}, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.163.01"},
		{"GPU operator lib64", func(t *testing.T, root string) {
			mkfile(t, filepath.Join(root, "usr/lib64/libnvidia-ml.so.1"), "lib")
		}, []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64"}, "usr/lib64/libnvidia-ml.so.1"},
		{"Debian alternatives: absolute links resolve inside the root", func(t *testing.T, root string) {
			mkfile(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.261.03"), "lib")
			symlink(t, "/etc/nvidia/current/libnvidia-ml.so.1", filepath.Join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
			symlink(t, "/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.261.03", filepath.Join(root, "etc/nvidia/current/libnvidia-ml.so.1"))
		}, []string{"usr/lib/x86_64-linux-gnu"}, "usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.261.03"},
		{"dot-dot stays inside the root", func(t *testing.T, root string) {
			symlink(t, "../../../../../../lib64/libnvidia-ml.so.1", filepath.Join(root, "usr/lib64/libnvidia-ml.so.1"))
			mkfile(t, filepath.Join(root, "lib64/libnvidia-ml.so.1"), "lib")
		}, []string{"/usr/lib64"}, "lib64/libnvidia-ml.so.1"},
		{"a path naming the file", func(t *testing.T, root string) {
			mkfile(t, filepath.Join(root, "opt/nv/libnvidia-ml.so.1"), "lib")
		}, []string{"/opt/nv/libnvidia-ml.so.1"}, "opt/nv/libnvidia-ml.so.1"},
		{"first path wins", func(t *testing.T, root string) {
			mkfile(t, filepath.Join(root, "a/libnvidia-ml.so.1"), "a")
			mkfile(t, filepath.Join(root, "b/libnvidia-ml.so.1"), "b")
		}, []string{"b", "a"}, "b/libnvidia-ml.so.1"},
		{"a dangling link is not a library", func(t *testing.T, root string) {
			symlink(t, "/nowhere/libnvidia-ml.so.1", filepath.Join(root, "usr/lib64/libnvidia-ml.so.1"))
		}, []string{"/usr/lib64"}, ""},
		{"a link loop", func(t *testing.T, root string) {
			symlink(t, "libnvidia-ml.so.2", filepath.Join(root, "usr/lib64/libnvidia-ml.so.1"))
			symlink(t, "libnvidia-ml.so.1", filepath.Join(root, "usr/lib64/libnvidia-ml.so.2"))
		}, []string{"/usr/lib64"}, ""},
		{"a directory of that name", func(t *testing.T, root string) {
			if err := os.MkdirAll(filepath.Join(root, "usr/lib64/libnvidia-ml.so.1"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, []string{"/usr/lib64"}, ""},
		{"empty root", func(*testing.T, string) {}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, root)
			got, err := gpunvml.FindLibrary(root, tc.paths)
			if tc.want == "" {
				var de *gpunvml.DriverError
				if !errors.As(err, &de) || !errors.Is(err, gpunvml.ErrLibraryNotFound) || !errors.Is(err, gpunvml.ErrNoDriver) {
					t.Fatalf("FindLibrary = %q, %v; want a DriverError wrapping ErrLibraryNotFound and ErrNoDriver", got, err)
				}
				if !strings.HasPrefix(err.Error(), "NVML library not found under driver root "+root) || len(de.Searched) == 0 {
					t.Errorf("error %q, searched %v: want the words and the paths searched", err, de.Searched)
				}
				return
			}
			if err != nil || got != filepath.Join(root, tc.want) {
				t.Errorf("FindLibrary = %q, %v; want %q", got, err, filepath.Join(root, tc.want))
			}
		})
	}
}

func TestFindLibraryBadRoot(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	mkfile(t, file, "x")
	for name, root := range map[string]string{"missing": filepath.Join(t.TempDir(), "nope"), "a file": file} {
		t.Run(name, func(t *testing.T) {
			_, err := gpunvml.FindLibrary(root, nil)
			if !errors.Is(err, gpunvml.ErrLibraryNotFound) || !strings.Contains(err.Error(), "driver root "+root+": the driver root") {
				t.Errorf("FindLibrary(%s) = %v, want library not found naming the root", root, err)
			}
		})
	}
}

// A file the dynamic loader refuses is "cannot be loaded", with the loader's own words; one built
// for another architecture says so too. Nothing panics.
func TestOpenDriverRootUnloadable(t *testing.T) {
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib64/libnvidia-ml.so.1")
	mkfile(t, lib, "not a library at all, but long enough to have an ELF header's size........")
	_, err := gpunvml.OpenDriverRoot(root, []string{"/usr/lib64"})
	if !errors.Is(err, gpunvml.ErrLibraryNotLoadable) || !errors.Is(err, gpunvml.ErrNoDriver) ||
		!strings.HasPrefix(err.Error(), "NVML library cannot be loaded: "+lib) || !strings.Contains(err.Error(), "invalid ELF header") {
		t.Errorf("garbage: %v, want cannot be loaded with the loader's error", err)
	}

	// A real shared library of this machine, relabelled as another architecture's.
	own, rerr := os.ReadFile("/proc/self/exe")
	if rerr != nil {
		t.Skip(rerr)
	}
	machine := []byte{183, 0} // EM_AARCH64
	if own[18] == 183 {
		machine = []byte{62, 0} // EM_X86_64
	}
	copy(own[18:20], machine)
	if err := os.WriteFile(lib, own, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = gpunvml.OpenDriverRoot(root, []string{"/usr/lib64"})
	if !errors.Is(err, gpunvml.ErrLibraryNotLoadable) || !strings.Contains(err.Error(), "built for EM_") || !strings.Contains(err.Error(), "this process is") {
		t.Errorf("foreign architecture: %v, want cannot be loaded, built for another architecture", err)
	}
}

// NVIDIA's real libraries, loaded by path from a driver root through go-nvml's cgo path: each
// answers that the kernel driver is not loaded (there is no GPU here), which proves the load. One
// process per library: the dynamic loader keeps the first libnvidia-ml.so.1 a process loads.
func TestOpenDriverRootRealLibraries(t *testing.T) {
	if lib := os.Getenv("GPUHEALTH_TEST_OPEN_LIBRARY"); lib != "" {
		openRealLibrary(t, lib)
		return
	}
	dir := os.Getenv(gpunvml.DriversEnv)
	if dir == "" {
		t.Skipf("$%s is not set: run hack/nvidia-drivers.sh (make unit does)", gpunvml.DriversEnv)
	}
	versions, err := filepath.Glob(filepath.Join(dir, "[0-9]*"))
	if err != nil || len(versions) < 4 {
		t.Fatalf("%s holds %v (%v), want four driver versions", dir, versions, err)
	}
	for _, v := range versions {
		t.Run(filepath.Base(v), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestOpenDriverRootRealLibraries$", "-test.v")
			cmd.Env = append(os.Environ(), "GPUHEALTH_TEST_OPEN_LIBRARY="+v)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%v\n%s", err, out)
			}
		})
	}
}

func openRealLibrary(t *testing.T, versionDir string) {
	root := t.TempDir()
	data, err := os.ReadFile(filepath.Join(versionDir, "libnvidia-ml.so."+filepath.Base(versionDir)))
	if err != nil {
		t.Fatal(err)
	}
	mkfile(t, filepath.Join(root, "run/nvidia/driver/usr/lib64", "libnvidia-ml.so."+filepath.Base(versionDir)), string(data))
	symlink(t, "libnvidia-ml.so."+filepath.Base(versionDir), filepath.Join(root, "run/nvidia/driver/usr/lib64/libnvidia-ml.so.1"))
	d := &gpunvml.DriverRoot{Root: filepath.Join(root, "run/nvidia/driver")}
	for attempt := range 2 { // a retry initialises the library loaded before
		b, err := d.Open()
		if err == nil {
			_ = b.Close()
			t.Skip("an NVIDIA kernel driver is loaded here")
		}
		want := "the NVIDIA kernel driver is not loaded: the NVML library " + filepath.Join(root, "run/nvidia/driver/usr/lib64/libnvidia-ml.so."+filepath.Base(versionDir)) + " loaded"
		if !errors.Is(err, gpunvml.ErrDriverNotLoaded) || !errors.Is(err, gpunvml.ErrNoDriver) || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("attempt %d: %v, want %q", attempt, err, want)
		}
	}
	// A driver upgrade replaces the library: this process cannot load the new one (Changed).
	libDir := filepath.Join(root, "run/nvidia/driver/usr/lib64")
	if changed, err := d.Changed(); changed || err != nil {
		t.Errorf("Changed with the library loaded = %v, %v; want false", changed, err)
	}
	if err := os.RemoveAll(libDir); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Changed(); !errors.Is(err, gpunvml.ErrLibraryNotFound) {
		t.Errorf("Changed with the driver away = %v, want ErrLibraryNotFound", err)
	}
	mkfile(t, filepath.Join(libDir, "libnvidia-ml.so.999.1"), string(data))
	symlink(t, "libnvidia-ml.so.999.1", filepath.Join(libDir, "libnvidia-ml.so.1"))
	if changed, err := d.Changed(); !changed || err != nil {
		t.Errorf("Changed after the library was replaced = %v, %v; want true", changed, err)
	}
}

// A library that loads but lacks a function the backend calls unguarded, or holds a reference
// that does not resolve, is refused before go-nvml's first call, with the missing functions or
// the loader's words: never the "symbol lookup error" that ends the process (#45).
func TestOpenDriverRootPartialLibrary(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler:", err)
	}
	build := func(t *testing.T, src string) (root, lib string) {
		t.Helper()
		root = t.TempDir()
		lib = filepath.Join(root, "usr/lib64/libnvidia-ml.so.1")
		if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
			t.Fatal(err)
		}
		c := filepath.Join(t.TempDir(), "stub.c")
		if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, c).CombinedOutput(); err != nil {
			t.Fatalf("cc: %v\n%s", err, out)
		}
		return root, lib
	}
	t.Run("lacks core functions", func(t *testing.T) {
		root, lib := build(t, "int nvmlInit_v2(void) { return 0; }\nint nvmlDeviceGetCount(unsigned *n) { *n = 0; return 0; }\n")
		_, err := gpunvml.OpenDriverRoot(root, []string{"/usr/lib64"})
		if !errors.Is(err, gpunvml.ErrLibraryNotLoadable) || !errors.Is(err, gpunvml.ErrNoDriver) ||
			!strings.HasPrefix(err.Error(), "NVML library cannot be loaded: "+lib+": lacks nvmlShutdown, nvmlErrorString, nvmlSystemGetDriverVersion, ") ||
			strings.Contains(err.Error(), "nvmlDeviceGetCount_v2") {
			t.Errorf("err = %v, want cannot be loaded naming the missing functions (not nvmlDeviceGetCount, which it has)", err)
		}
	})
	t.Run("a reference that does not resolve", func(t *testing.T) {
		var src strings.Builder
		src.WriteString("extern int gpuhealth_nowhere(void);\n")
		for _, f := range []string{"nvmlInit_v2", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount_v2",
			"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetPciInfo_v3"} {
			fmt.Fprintf(&src, "int %s(void) { return gpuhealth_nowhere(); }\n", f)
		}
		root, lib := build(t, src.String())
		_, err := gpunvml.OpenDriverRoot(root, []string{"/usr/lib64"})
		if !errors.Is(err, gpunvml.ErrLibraryNotLoadable) || !strings.HasPrefix(err.Error(), "NVML library cannot be loaded: "+lib) ||
			!strings.Contains(err.Error(), "gpuhealth_nowhere") {
			t.Errorf("err = %v, want cannot be loaded with the loader's words on the undefined symbol", err)
		}
	})
}
