package dra

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuhealth/gpuhealth/pkg/dra/nvidia"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Attributes names the device attributes that tie a DRA device to a GPU. A name without a
// domain matches as written and qualified with the driver's name (the NVIDIA driver publishes
// "uuid", which CEL reads as device.attributes["gpu.nvidia.com"].uuid).
type Attributes struct {
	// UUID carries the UUID of the GPU or MIG device that the DRA device is.
	UUID string
	// ParentUUID carries the UUID of the physical GPU that a MIG device or MIG partition belongs
	// to. A fault of the whole GPU taints every device that names it here.
	ParentUUID string
	// PCIBusID carries the PCI address of the physical GPU ("0000:3b:00.0"). A fault of the whole
	// GPU taints every device at that address, such as a VFIO passthrough device, whose uuid is
	// not the GPU's.
	PCIBusID string
}

// DefaultAttributes returns the attribute names NVIDIA's DRA driver (gpu.nvidia.com) publishes
// (package nvidia), the agent configuration's defaults too: it sets uuid on whole GPUs, static MIG
// devices and VFIO devices, parentUUID on static and dynamic MIG devices, and the Kubernetes
// standard attribute resource.kubernetes.io/pciBusID on every device of a physical GPU (see
// docs/dra-devices.md).
func DefaultAttributes() Attributes {
	return Attributes{UUID: nvidia.UUIDAttribute, ParentUUID: nvidia.ParentUUIDAttribute, PCIBusID: nvidia.PCIBusIDAttribute}
}

// WithDefaults returns a copy with the default name in place of every empty one.
func (a Attributes) WithDefaults() Attributes {
	d := DefaultAttributes()
	if a.UUID == "" {
		a.UUID = d.UUID
	}
	if a.ParentUUID == "" {
		a.ParentUUID = d.ParentUUID
	}
	if a.PCIBusID == "" {
		a.PCIBusID = d.PCIBusID
	}
	return a
}

// Validate reports an empty, malformed or repeated name. Names follow the rules of a DRA
// attribute name: a C identifier of at most 32 characters, optionally after a DNS subdomain and
// a slash.
func (a Attributes) Validate() error {
	var errs []error
	seen := map[string]string{}
	for _, f := range []struct{ field, name string }{
		{"uuidAttribute", a.UUID}, {"parentUUIDAttribute", a.ParentUUID}, {"pciBusIDAttribute", a.PCIBusID},
	} {
		if err := validateName(f.name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.field, err))
			continue
		}
		if other, dup := seen[f.name]; dup {
			errs = append(errs, fmt.Errorf("%s: %q is already %s; each attribute must have its own name", f.field, f.name, other))
		}
		seen[f.name] = f.field
	}
	return errors.Join(errs...)
}

var cIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func validateName(name string) error {
	if name == "" {
		return errors.New("must not be empty")
	}
	domain, id, qualified := strings.Cut(name, "/")
	if !qualified {
		domain, id = "", name
	}
	if qualified {
		if msgs := validation.IsDNS1123Subdomain(domain); len(msgs) > 0 || len(domain) > resourceapi.DeviceMaxDomainLength {
			return fmt.Errorf("%q: the domain must be a DNS subdomain of at most %d characters", name, resourceapi.DeviceMaxDomainLength)
		}
	}
	if !cIdentifier.MatchString(id) || len(id) > resourceapi.DeviceMaxIDLength {
		return fmt.Errorf("%q: the name must be a C identifier of at most %d characters", name, resourceapi.DeviceMaxIDLength)
	}
	return nil
}

// NormalizePCIBusID returns a PCI address in the extended BDF form of the Kubernetes standard
// attribute ("0000:3b:00.0"): health.NormalizePCIBusID, for drivers that embed this package.
func NormalizePCIBusID(s string) (string, error) { return health.NormalizePCIBusID(s) }
