// Package version is gpuhealth's one version variable, set at link time for both binaries
// (gpuhealth and gpuhealth-agent):
//
//	-ldflags "-X github.com/gpuhealth/gpuhealth/internal/version.Version=v0.1.0"
//
// It imports nothing but the runtime's build information, so that the agent binary links no more
// than it needs.
package version

import "runtime/debug"

// Version is the release; "devel" in a build without the link-time flag.
var Version = "devel"

// String is the version and the Go release that built the binary: "v0.1.0 (go1.26.8)".
func String() string {
	goVersion := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
	}
	return Version + " (" + goVersion + ")"
}
