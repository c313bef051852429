package simdriver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
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

// SocketPath is where the simulator of a driver root listens when the library is in the
// default library directory.
func SocketPath(driverRoot string) string {
	return filepath.Join(driverRoot, libDir(), SocketName)
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
