package nvml

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The NVIDIA driver's user-space libraries live under a driver root: "/" when the driver is
// installed on the host (or when the NVIDIA container toolkit injects libnvidia-ml.so.1 into the
// container), "/run/nvidia/driver" for the GPU operator's driver container, mounted into the
// agent's container wherever the chart puts it. The library is looked up there and dlopened by
// its absolute path, as NVIDIA's own projects do (go-nvml's WithLibraryPath): its NEEDED
// libraries (libc, libm, libdl, libpthread, librt) then resolve from this process's own glibc,
// never from the driver root's, which may be another glibc version that cannot run this binary.
// Putting the driver root on LD_LIBRARY_PATH instead makes the dynamic loader take the host's libc
// for the whole process: on a host whose glibc differs, the process cannot even start.

// LibraryName is the SONAME of NVIDIA's management library.
const LibraryName = "libnvidia-ml.so.1"

// DefaultDriverRoot is the driver root of a driver installed on the host.
const DefaultDriverRoot = "/"

// DefaultLibraryPaths returns the directories, relative to the driver root, searched for
// LibraryName by default, in order: the multiarch directory of this process's architecture
// (where Debian and Ubuntu install the driver and the container toolkit injects it), the lib64
// directories of RHEL-like systems and of the GPU operator's driver container, the plain lib
// directories, and Debian's own package directory (usr/lib/<triplet>/nvidia/current).
func DefaultLibraryPaths() []string {
	t := triplet(runtime.GOARCH)
	paths := []string{"usr/lib/" + t, "usr/lib64", "lib/" + t, "lib64", "usr/lib", "lib"}
	if t != "" {
		paths = append(paths, "usr/lib/"+t+"/nvidia/current")
	}
	return paths
}

func triplet(goarch string) string {
	switch goarch {
	case "amd64":
		return "x86_64-linux-gnu"
	case "arm64":
		return "aarch64-linux-gnu"
	}
	return goarch + "-linux-gnu"
}

// The three ways a machine can fail to offer NVML. A *DriverError wraps exactly one of them, and
// ErrNoDriver.
var (
	// ErrLibraryNotFound: no libnvidia-ml.so.1 under the driver root.
	ErrLibraryNotFound = errors.New("NVML library not found")
	// ErrLibraryNotLoadable: the library is there, but the dynamic loader refuses it (a
	// dependency is missing, it is built for another architecture, it is not a library).
	ErrLibraryNotLoadable = errors.New("NVML library cannot be loaded")
	// ErrDriverNotLoaded: the library loaded, and NVML answered that the NVIDIA kernel module
	// is not running (ERROR_DRIVER_NOT_LOADED).
	ErrDriverNotLoaded = errors.New("the NVIDIA kernel driver is not loaded")
)

// DriverError says why NVML is not available: one of ErrLibraryNotFound, ErrLibraryNotLoadable
// or ErrDriverNotLoaded (Kind), with the paths searched or the library tried, and the cause (the
// loader's error, or NVML's return code).
type DriverError struct {
	Kind error
	// Root is the driver root searched ("" when the library was not looked up under one).
	Root string
	// Searched lists the files looked for (ErrLibraryNotFound).
	Searched []string
	// Library is the library file that was tried.
	Library string
	// Detail says more in words: a driver root that does not exist, an architecture mismatch.
	Detail string
	// Err is the cause: the dynamic loader's error or the nvml.Return.
	Err error
}

// Error implements error. The message starts with Kind's words.
func (e *DriverError) Error() string {
	var b strings.Builder
	b.WriteString(e.Kind.Error())
	switch {
	case errors.Is(e.Kind, ErrLibraryNotFound):
		if e.Root != "" {
			fmt.Fprintf(&b, " under driver root %s", e.Root)
		}
		if e.Detail != "" {
			fmt.Fprintf(&b, ": %s", e.Detail)
		}
		if len(e.Searched) > 0 {
			fmt.Fprintf(&b, " (searched %s)", strings.Join(e.Searched, ", "))
		}
		b.WriteString(": is the NVIDIA driver installed, and is --driver-root where its libraries are?")
		if e.Err != nil {
			fmt.Fprintf(&b, " (%v)", e.Err)
		}
	case errors.Is(e.Kind, ErrLibraryNotLoadable):
		if e.Library != "" {
			fmt.Fprintf(&b, ": %s", e.Library)
		}
		if e.Detail != "" {
			fmt.Fprintf(&b, ": %s", e.Detail)
		}
		if e.Err != nil {
			fmt.Fprintf(&b, ": %v", e.Err)
		}
	default:
		b.WriteString(": the NVML library")
		if e.Library != "" {
			fmt.Fprintf(&b, " %s", e.Library)
		}
		b.WriteString(" loaded, and nvmlInit answered")
		if e.Err != nil {
			fmt.Fprintf(&b, " %v", e.Err)
		}
		b.WriteString(" (ERROR_DRIVER_NOT_LOADED): is the nvidia kernel module loaded (lsmod | grep nvidia), or is the driver being installed or upgraded?")
	}
	return b.String()
}

// Unwrap lets errors.Is find Kind, ErrNoDriver and the cause.
func (e *DriverError) Unwrap() []error {
	errs := []error{e.Kind, ErrNoDriver}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// FindLibrary looks for LibraryName under root in each of libraryPaths (relative to root; an
// entry naming a file ending in .so.1 is taken as the library itself), following symbolic
// links as the driver root sees them (an absolute link target is resolved inside root, as it
// would be on the host: Debian links libnvidia-ml.so.1 through /etc/alternatives). It returns
// the absolute path of the library file, or a *DriverError wrapping ErrLibraryNotFound that
// lists every path searched. Empty libraryPaths means DefaultLibraryPaths.
func FindLibrary(root string, libraryPaths []string) (string, error) {
	if root == "" {
		root = DefaultDriverRoot
	}
	if len(libraryPaths) == 0 {
		libraryPaths = DefaultLibraryPaths()
	}
	root = filepath.Clean(root)
	notFound := &DriverError{Kind: ErrLibraryNotFound, Root: root}
	switch fi, err := os.Stat(root); {
	case errors.Is(err, fs.ErrNotExist):
		notFound.Detail = "the driver root does not exist"
		return "", notFound
	case err != nil:
		notFound.Detail = "the driver root cannot be read"
		notFound.Err = err
		return "", notFound
	case !fi.IsDir():
		notFound.Detail = "the driver root is not a directory"
		return "", notFound
	}
	for _, p := range libraryPaths {
		inside := path.Clean("/" + filepath.ToSlash(p))
		if !strings.HasSuffix(inside, ".so.1") {
			inside = path.Join(inside, LibraryName)
		}
		notFound.Searched = append(notFound.Searched, filepath.Join(root, inside))
		resolved, err := resolveInRoot(root, inside)
		if err != nil {
			continue
		}
		if fi, err := os.Stat(resolved); err == nil && fi.Mode().IsRegular() {
			return resolved, nil
		}
	}
	return "", notFound
}

// maxSymlinks bounds the links followed while resolving one path, as the kernel's ELOOP does.
const maxSymlinks = 40

// resolveInRoot resolves inside, an absolute path as seen from root, to a path on this machine
// with every symbolic link followed as it would be with root as "/": absolute targets restart at
// root, and ".." never climbs above it.
func resolveInRoot(root, inside string) (string, error) {
	pending := strings.Split(inside, "/")
	resolved := "" // "" is root itself; otherwise "/a/b"
	links := 0
	for len(pending) > 0 {
		part := pending[0]
		pending = pending[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			if resolved != "" {
				resolved = path.Dir(resolved)
				if resolved == "/" {
					resolved = ""
				}
			}
			continue
		}
		next := resolved + "/" + part
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if links++; links > maxSymlinks {
			return "", fmt.Errorf("%s: too many levels of symbolic links", filepath.Join(root, inside))
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			resolved = ""
		}
		pending = append(strings.Split(target, "/"), pending...)
	}
	return filepath.Join(root, resolved), nil
}

// elfMachines maps this process's architecture to the ELF machine its libraries must have.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "ppc64le": elf.EM_PPC64, "386": elf.EM_386,
}

// checkLoadable dlopens the library the way go-nvml will (RTLD_LAZY|RTLD_GLOBAL) and closes it
// again, so that a refusal is reported with the loader's own words (which name a missing
// dependency) instead of go-nvml's bare ERROR_LIBRARY_NOT_FOUND. A library built for another
// architecture is said so in words too.
func checkLoadable(library string) error {
	lib := dl.New(library, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	loadErr := lib.Open()
	if loadErr == nil {
		missing := missingCoreFunctions(lib)
		if err := lib.Close(); err != nil {
			return &DriverError{Kind: ErrLibraryNotLoadable, Library: library, Err: err}
		}
		if len(missing) > 0 {
			return &DriverError{Kind: ErrLibraryNotLoadable, Library: library, Detail: "lacks " + strings.Join(missing, ", ") +
				" (a stub, a partial install, or not NVIDIA's NVML library)"}
		}
		// Every reference the library makes must resolve: go-nvml binds lazily, and a reference
		// that does not would end the process at its first call ("symbol lookup error").
		now := dl.New(library, dl.RTLD_NOW|dl.RTLD_LOCAL)
		if err := now.Open(); err != nil {
			return &DriverError{Kind: ErrLibraryNotLoadable, Library: library, Err: err}
		}
		if err := now.Close(); err != nil {
			return &DriverError{Kind: ErrLibraryNotLoadable, Library: library, Err: err}
		}
		return nil
	}
	e := &DriverError{Kind: ErrLibraryNotLoadable, Library: library, Err: loadErr}
	f, err := elf.Open(library)
	if err != nil {
		e.Detail = "not an ELF shared library"
		return e
	}
	defer f.Close()
	if want, ok := elfMachines[runtime.GOARCH]; ok && (f.Machine != want || f.Class != elf.ELFCLASS64 && runtime.GOARCH != "386") {
		e.Detail = fmt.Sprintf("built for %s (%s), this process is %s", f.Machine, f.Class, runtime.GOARCH)
	}
	return e
}

// coreFunctions are the NVML functions the backend calls without looking them up first (the
// optional ones are in symbols.go), each with the versions go-nvml binds it to: one of each must
// be there, or go-nvml's first call of it ends the process with the loader's "symbol lookup
// error" (its cgo references resolve lazily).
var coreFunctions = [][]string{
	{"nvmlInit_v2", "nvmlInit"},
	{"nvmlShutdown"},
	{"nvmlErrorString"},
	{"nvmlSystemGetDriverVersion"},
	{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"},
	{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"},
	{"nvmlDeviceGetHandleByUUID"},
	{"nvmlDeviceGetUUID"},
	{"nvmlDeviceGetName"},
	{"nvmlDeviceGetMinorNumber"},
	{"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo"},
}

// missingCoreFunctions names the core functions (the first name of each) that lib lacks.
func missingCoreFunctions(lib *dl.DynamicLibrary) []string {
	var missing []string
	for _, names := range coreFunctions {
		found := false
		for _, n := range names {
			if lib.Lookup(n) == nil {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, names[0])
		}
	}
	return missing
}

// DriverRoot opens the NVML backend on NVIDIA's library under a driver root. Keep one DriverRoot
// for every attempt of a process: go-nvml cannot unload a library whose nvmlInit failed, and the
// dynamic loader answers any later load of the same SONAME with the library first loaded, so a
// retry must initialise the library it loaded before (which is what DriverRoot does) rather than
// load it anew.
type DriverRoot struct {
	// Root is the driver root ("" is DefaultDriverRoot).
	Root string
	// LibraryPaths are the directories inside Root searched for LibraryName (empty:
	// DefaultLibraryPaths).
	LibraryPaths []string

	mu     sync.Mutex
	loaded map[string]nvml.Interface
	// files is the file each loaded library path named when it was loaded.
	files map[string]os.FileInfo
}

// OpenDriverRoot opens the backend on the library under root once: (&DriverRoot{Root: root,
// LibraryPaths: libraryPaths}).Open(opts...).
func OpenDriverRoot(root string, libraryPaths []string, opts ...Option) (*Backend, error) {
	return (&DriverRoot{Root: root, LibraryPaths: libraryPaths}).Open(opts...)
}

// Open finds NVIDIA's NVML library under the driver root (FindLibrary), loads it by its absolute
// path and opens the backend on it (Open). Without a usable driver the error is a *DriverError:
// the library is not there (ErrLibraryNotFound), the loader refuses it (ErrLibraryNotLoadable),
// or the kernel driver is not loaded (ErrDriverNotLoaded).
//
// With the driver root "/", a library the paths do not hold is also looked for where the dynamic
// loader itself looks for LibraryName (LD_LIBRARY_PATH, ld.so.cache): some runtimes inject it into
// a directory of their own and run ldconfig.
func (d *DriverRoot) Open(opts ...Option) (*Backend, error) {
	root := d.Root
	if root == "" {
		root = DefaultDriverRoot
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	library, err := FindLibrary(root, d.LibraryPaths)
	if err != nil {
		if filepath.Clean(root) != DefaultDriverRoot {
			return nil, err
		}
		if d.loaded[LibraryName] == nil {
			if loadErr := checkLoadable(LibraryName); loadErr != nil {
				if de := (*DriverError)(nil); errors.As(err, &de) {
					de.Searched = append(de.Searched, LibraryName+" in the dynamic loader's search path")
				}
				return nil, err
			}
		}
		library = LibraryName
	}
	lib := d.loaded[library]
	if lib == nil {
		if err := checkLoadable(library); err != nil {
			return nil, err
		}
		lib = nvml.New(nvml.WithLibraryPath(library))
		if d.loaded == nil {
			d.loaded, d.files = map[string]nvml.Interface{}, map[string]os.FileInfo{}
		}
		d.loaded[library] = lib
		if fi, err := os.Stat(library); err == nil {
			d.files[library] = fi
		}
	}
	b, err := Open(lib, opts...)
	if de := (*DriverError)(nil); errors.As(err, &de) && de.Library == "" {
		de.Library, de.Root = library, root
	}
	if b != nil {
		b.library = library
	}
	return b, err
}

// Library returns the NVML library file the backend loaded ("" when it was given a library).
func (b *Backend) Library() string { return b.library }

// Up reports whether NVML is initialised: false while it is down after a GPU reset (Init failed,
// retried with backoff).
func (b *Backend) Up() bool {
	_, err := b.gate.downState()
	return err == nil
}

// Changed reports whether the library under the driver root is another file than the one this
// DriverRoot loaded (a driver upgrade installed a new one): this process can then never use it
// (the loader keeps the first), and only a new process can. The error wraps ErrLibraryNotFound
// while there is no library under the root (the driver is away). Before any load it reports
// false.
func (d *DriverRoot) Changed() (bool, error) {
	root := d.Root
	if root == "" {
		root = DefaultDriverRoot
	}
	library, err := FindLibrary(root, d.LibraryPaths)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		if d.loaded[LibraryName] != nil {
			return false, nil // found through the loader's own search path: nothing to compare
		}
		return false, err
	}
	if len(d.files) == 0 {
		return false, nil
	}
	loaded, ok := d.files[library]
	if !ok {
		return true, nil // another path now: another driver layout
	}
	now, err := os.Stat(library)
	if err != nil {
		return false, &DriverError{Kind: ErrLibraryNotFound, Root: root, Searched: []string{library}, Err: err}
	}
	return !os.SameFile(loaded, now), nil
}
