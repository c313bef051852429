package simdriver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// LibraryDirEnv overrides where the built libraries are looked for.
const LibraryDirEnv = "GPUHEALTH_SIM_DRIVER_LIBS"

// DefaultLibraryDir is where hack/sim-driver.sh puts the libraries relative to the gpuhealth
// binary (bin/sim-driver beside bin/gpuhealth; /sim-driver in the image), or $GPUHEALTH_SIM_DRIVER_LIBS.
func DefaultLibraryDir() string {
	if d := os.Getenv(LibraryDirEnv); d != "" {
		return d
	}
	exe, err := os.Executable()
	if err != nil {
		return "sim-driver"
	}
	return filepath.Join(filepath.Dir(exe), "sim-driver")
}

// libDir is the library directory inside a driver root, where the NVIDIA container toolkit and
// Debian put libnvidia-ml.so.1.
func libDir() string {
	switch runtime.GOARCH {
	case "arm64":
		return "usr/lib/aarch64-linux-gnu"
	default:
		return "usr/lib/x86_64-linux-gnu"
	}
}

// Profiles lists the driver versions built into dir, oldest first.
func Profiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("the simulated driver's libraries (hack/sim-driver.sh, make build): %w", err)
	}
	var out []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "libnvidia-ml.so."+e.Name())); err == nil {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no simulated driver library in %s: run make build (hack/sim-driver.sh)", dir)
	}
	slices.Sort(out)
	return out, nil
}

// Installed is what Install put into a driver root.
type Installed struct {
	Version, Library, Socket string
}

// Install copies the library of driver profile version (exact, or a branch such as "535"; ""
// the newest) from libraryDir into the driver root's library directory subdir (relative to the
// root; "" is usr/lib/<triplet>, where Debian and the container toolkit put it; the GPU
// operator's driver container has usr/lib64), as libnvidia-ml.so.<version> with its
// libnvidia-ml.so.1 link, plus the driver's version file (proc/driver/nvidia/version). The
// simulator's socket goes beside the library.
func Install(root, version, libraryDir, subdir string) (Installed, error) {
	if root == "" {
		return Installed{}, errors.New("no driver root")
	}
	if libraryDir == "" {
		libraryDir = DefaultLibraryDir()
	}
	profiles, err := Profiles(libraryDir)
	if err != nil {
		return Installed{}, err
	}
	chosen := ""
	for _, p := range profiles {
		if version == "" || p == version || strings.HasPrefix(p, version+".") {
			chosen = p
		}
	}
	if chosen == "" {
		return Installed{}, fmt.Errorf("--driver-version %s: no such profile (have %s)", version, strings.Join(profiles, ", "))
	}
	if subdir == "" {
		subdir = libDir()
	}
	if filepath.IsAbs(subdir) || strings.HasPrefix(filepath.Clean(subdir), "..") {
		return Installed{}, fmt.Errorf("the library directory %q must be relative to the driver root", subdir)
	}
	dir := filepath.Join(root, subdir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Installed{}, fmt.Errorf("installing the simulated driver into %s: %w", root, err)
	}
	name := "libnvidia-ml.so." + chosen
	data, err := os.ReadFile(filepath.Join(libraryDir, chosen, name))
	if err != nil {
		return Installed{}, err
	}
	lib := filepath.Join(dir, name)
	if err := writeAtomic(lib, data, 0o755); err != nil {
		return Installed{}, fmt.Errorf("installing the simulated driver into %s: %w", root, err)
	}
	link := filepath.Join(dir, "libnvidia-ml.so.1")
	_ = os.Remove(link)
	if err := os.Symlink(name, link); err != nil {
		return Installed{}, fmt.Errorf("installing the simulated driver into %s: %w", root, err)
	}
	versionFile := filepath.Join(root, "proc/driver/nvidia/version")
	if err := os.MkdirAll(filepath.Dir(versionFile), 0o755); err == nil {
		_ = writeAtomic(versionFile, []byte(fmt.Sprintf("NVRM version: NVIDIA UNIX %s Kernel Module  %s  (gpuhealth simulated driver)\n", runtime.GOARCH, chosen)), 0o644)
	}
	socket := filepath.Join(dir, SocketName)
	if len(socket) >= 108 {
		return Installed{}, fmt.Errorf("the socket path %s is %d bytes, longer than a Unix socket allows (107): use a shorter driver root", socket, len(socket))
	}
	return Installed{Version: chosen, Library: lib, Socket: socket}, nil
}

// InstallDCGMI installs the simulated dcgmi as DIR/usr/bin/dcgmi (DCGMIPath): a shell script
// that runs exe (this gpuhealth binary) as `exe sim-driver dcgmi --driver-root DIR
// --dcgm-version V "$@"`, so that `DIR/usr/bin/dcgmi diag -r 2 -i gpu:1 -j` works as NVIDIA's tool
// does, wherever exe's path is the same (the node itself, tests, the demo). It returns the
// script's path.
func InstallDCGMI(root, exe, dcgmVersion string) (string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	script := fmt.Sprintf(`#!/bin/sh
# NVIDIA's dcgmi as gpuhealth's simulated driver plays it: a DCGM diagnostic of one simulated GPU,
# answered by the simulator serving this driver root (docs/nvml.md, "The simulated driver").
exec %s sim-driver dcgmi --driver-root %s --dcgm-version %s "$@"
`, shellQuote(exe), shellQuote(abs), shellQuote(dcgmVersion))
	path := filepath.Join(abs, DCGMIPath)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("installing the simulated dcgmi into %s: %w", root, err)
	}
	if err := writeAtomic(path, []byte(script), 0o755); err != nil {
		return "", fmt.Errorf("installing the simulated dcgmi into %s: %w", root, err)
	}
	return path, nil
}

// writeAtomic replaces path, so that a process that has the old file mapped keeps it.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// CheckScenario refuses what a driver cannot serve: kernel-log lines (the agent reads the kernel
// log itself), node reboots (a driver cannot reboot its node) and peer nodes' faults.
func CheckScenario(sc *sim.Scenario) error {
	if sc == nil {
		return errors.New("no scenario")
	}
	if len(sc.Missing) > 0 {
		// NVML would number the GPUs it answers for anew, and the PCI bus the agent compares
		// with is the machine's own: a missing GPU is tried with the sim backend and a sysfs tree.
		return errors.New("gpus.missing: the simulated driver serves every GPU of its scenario; use the sim backend (or inventory.sysfsRoot) for missing GPUs")
	}
	for _, ev := range append(append([]sim.Event{}, sc.Events...), sc.AfterReset...) {
		if err := checkEvent(ev); err != nil {
			return err
		}
	}
	return nil
}

func checkEvent(ev sim.Event) error {
	switch ev.Kind {
	case sim.EventKmsg:
		return fmt.Errorf("line %d: kmsg: the simulated driver serves NVML, not the kernel log (the agent reads the node's own)", ev.Line)
	case sim.EventReboot:
		return fmt.Errorf("line %d: reboot: a driver cannot reboot its node (restart the simulator instead)", ev.Line)
	case sim.EventPeerFault:
		return fmt.Errorf("line %d: peerFault: a driver knows nothing of other nodes (the agent reads its peers' reports)", ev.Line)
	}
	return nil
}

// parseEvent reads one scenario event without `at`, in the scenario file's own YAML form, for
// the GPUs of sc.
func parseEvent(sc *sim.Scenario, body []byte) (sim.Event, error) {
	var fields map[string]any
	if err := yaml.Unmarshal(body, &fields); err != nil {
		return sim.Event{}, fmt.Errorf("the event is not a YAML mapping: %w", err)
	}
	if fields == nil {
		return sim.Event{}, errors.New("empty event")
	}
	for _, k := range []string{"at", "afterReset"} {
		if _, ok := fields[k]; ok {
			return sim.Event{}, fmt.Errorf("%s: an injected event happens now; leave it out", k)
		}
	}
	fields["at"] = "0s"
	ev, err := yaml.Marshal(fields)
	if err != nil {
		return sim.Event{}, err
	}
	doc := fmt.Sprintf("apiVersion: %s\nkind: %s\nnode: %s\ngpus:\n  count: %d\n", sim.APIVersion, sim.Kind, sc.Node, sc.GPUCount)
	if len(sc.MIGInstances) > 0 {
		doc += "  migInstances: {"
		first := true
		for i, n := range sc.MIGInstances {
			if !first {
				doc += ", "
			}
			first = false
			doc += fmt.Sprintf("%q: %d", fmt.Sprint(i), n)
		}
		doc += "}\n"
	}
	doc += "events:\n- " + strings.ReplaceAll(strings.TrimSpace(string(ev)), "\n", "\n  ") + "\n"
	parsed, err := sim.ParseDriverScenario([]byte(doc))
	if err != nil {
		return sim.Event{}, err
	}
	if len(parsed.Events) != 1 {
		return sim.Event{}, errors.New("the event describes nothing to do")
	}
	if err := checkEvent(parsed.Events[0]); err != nil {
		return sim.Event{}, err
	}
	return parsed.Events[0], nil
}

// findSocket returns the simulator's socket in the first library directory of the driver root
// that has one (SocketPath's when none has).
func findSocket(root string) string {
	for _, d := range []string{libDir(), "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib64", "lib"} {
		p := filepath.Join(root, d, SocketName)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return SocketPath(root)
}

// ErrInjectRefused wraps the simulator's refusal of an injected event (bad input).
var ErrInjectRefused = errors.New("the simulator refused the event")

// Inject applies one event at once on the simulator serving the driver root (its socket is
// looked for in the library directories a driver root has).
func Inject(driverRoot, event string) error {
	c, err := net.DialTimeout("unix", findSocket(driverRoot), 5*time.Second)
	if err != nil {
		return fmt.Errorf("no simulator serves %s: %w", driverRoot, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	// The request and the event in one write: the simulator answers a bad request at once and
	// hangs up, and a second write could meet the closed connection.
	var msg bytes.Buffer
	if err := writeRequest(&msg, &request{Op: opInject, C: uint64(len(event))}); err != nil {
		return err
	}
	msg.WriteString(event)
	if _, err := c.Write(msg.Bytes()); err != nil {
		return err
	}
	var resp response
	if err := readResponse(c, &resp); err != nil {
		return fmt.Errorf("reading the simulator's answer: %w", err)
	}
	var n uint32
	if err := binary.Read(c, binary.LittleEndian, &n); err != nil {
		return fmt.Errorf("reading the simulator's answer: %w", err)
	}
	reason := make([]byte, min(n, maxInject))
	if _, err := io.ReadFull(c, reason); err != nil {
		return fmt.Errorf("reading the simulator's answer: %w", err)
	}
	switch {
	case resp.Ret != retSuccess && resp.N == 1:
		return fmt.Errorf("the simulated driver cannot do it now: %s", reason)
	case resp.Ret != retSuccess:
		return fmt.Errorf("%w: %s", ErrInjectRefused, reason)
	}
	return nil
}
