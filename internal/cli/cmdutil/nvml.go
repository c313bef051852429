package cmdutil

import (
	"strings"

	"github.com/spf13/pflag"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

// NVMLOptions say where the NVIDIA driver's libraries are: the flags --driver-root and
// --nvml-library-paths of every command that opens NVML (agent, device-plugin, probe, watch).
type NVMLOptions struct {
	DriverRoot   string
	LibraryPaths []string

	root *gpunvml.DriverRoot // made by the first Open
}

// AddFlags registers the flags on fs.
func (o *NVMLOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.DriverRoot, "driver-root", gpunvml.DefaultDriverRoot,
		`where the NVIDIA driver's files are, as this process sees them: / for a driver on the host or injected by the NVIDIA container toolkit, the mount point of the host's / or of the GPU operator's /run/nvidia/driver otherwise`)
	fs.StringSliceVar(&o.LibraryPaths, "nvml-library-paths", nil,
		"directories inside --driver-root searched in order for "+gpunvml.LibraryName+" (comma-separated; default "+strings.Join(gpunvml.DefaultLibraryPaths(), ",")+")")
}

// Open opens the NVML backend on the driver's library under the driver root. Every call of one
// NVMLOptions reuses the library an earlier call loaded (see gpunvml.DriverRoot): call it again
// to retry.
func (o *NVMLOptions) Open(opts ...gpunvml.Option) (*gpunvml.Backend, error) {
	if o.root == nil {
		o.root = &gpunvml.DriverRoot{Root: o.DriverRoot, LibraryPaths: o.LibraryPaths}
	}
	return o.root.Open(opts...)
}

// LibraryChanged reports whether the driver root now holds another NVML library than the one
// Open loaded (gpunvml.DriverRoot.Changed): only a new process can use it. Before Open it
// reports false.
func (o *NVMLOptions) LibraryChanged() (bool, error) {
	if o.root == nil {
		return false, nil
	}
	return o.root.Changed()
}

// Args returns the flags that point another gpuhealth command (probe) at the same library.
func (o *NVMLOptions) Args() []string {
	args := []string{"--driver-root", o.DriverRoot}
	if len(o.LibraryPaths) > 0 {
		args = append(args, "--nvml-library-paths", strings.Join(o.LibraryPaths, ","))
	}
	return args
}
