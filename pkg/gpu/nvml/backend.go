package nvml

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Defaults for the options.
const (
	DefaultSamplePeriod   = 10 * time.Second
	DefaultEventWait      = time.Second
	DefaultBackoffInitial = 100 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
)

// Sink receives what the backend learns. *health.Monitor satisfies it.
type Sink interface {
	// Signal receives one signal.
	Signal(health.Signal)
	// SetUnmonitored marks a device whose events cannot be watched (or clears the mark).
	SetUnmonitored(uuid string, unmonitored bool)
}

var _ Sink = (*health.Monitor)(nil)

type options struct {
	samplePeriod   time.Duration
	eventWait      time.Duration
	backoffInitial time.Duration
	backoffMax     time.Duration
	clock          clock.Clock
	logger         logr.Logger
}

// Option configures a Backend.
type Option func(*options)

// WithSamplePeriod sets the period of sampling rounds (default DefaultSamplePeriod).
func WithSamplePeriod(d time.Duration) Option { return func(o *options) { o.samplePeriod = d } }

// WithEventWait sets how long one EventSet.Wait call blocks (default DefaultEventWait). It bounds
// how long Run takes to return after its context ends.
func WithEventWait(d time.Duration) Option { return func(o *options) { o.eventWait = d } }

// WithWaitBackoff sets the first and the largest delay between retries after EventSet.Wait fails
// with anything but a timeout (defaults DefaultBackoffInitial, DefaultBackoffMax).
func WithWaitBackoff(initial, maxDelay time.Duration) Option {
	return func(o *options) { o.backoffInitial, o.backoffMax = initial, maxDelay }
}

// WithClock sets the clock that times signals, sampling rounds and backoff (default the real one).
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

// WithLogger sets the logger (default: discard).
func WithLogger(l logr.Logger) Option { return func(o *options) { o.logger = l } }

// Backend watches the GPUs NVML reports. Create it with Open, run it with Run, and Close it.
type Backend struct {
	lib  nvml.Interface
	opts options
	log  logr.Logger

	driverVersion string
	gpus          []*gpu
	devices       []health.Device
	skipped       []error

	stats stats

	closeOnce sync.Once
	closeErr  error
}

// gpu is one physical GPU of the inventory and the sampler's memory of it.
type gpu struct {
	handle nvml.Device
	dev    health.Device
	migs   []health.Device

	// mu serialises reads that compare with the previous reading (ECC totals) and the lazily
	// discovered NVLink set, between the sampler and the event loop.
	mu           sync.Mutex
	ecc          eccTotals
	eccValid     bool
	links        []int
	linksScanned bool
}

type eccTotals struct{ corrected, uncorrected uint64 }

// Open initialises NVML and takes the inventory. The caller owns the Backend and must Close it;
// on error nothing is left open. Without an NVIDIA driver the error wraps ErrNoDriver.
func Open(lib nvml.Interface, opts ...Option) (*Backend, error) {
	o := options{
		samplePeriod:   DefaultSamplePeriod,
		eventWait:      DefaultEventWait,
		backoffInitial: DefaultBackoffInitial,
		backoffMax:     DefaultBackoffMax,
		clock:          clock.RealClock{},
		logger:         logr.Discard(),
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.samplePeriod <= 0 {
		o.samplePeriod = DefaultSamplePeriod
	}
	if o.eventWait <= 0 {
		o.eventWait = DefaultEventWait
	}
	if o.backoffInitial <= 0 {
		o.backoffInitial = DefaultBackoffInitial
	}
	if o.backoffMax < o.backoffInitial {
		o.backoffMax = max(DefaultBackoffMax, o.backoffInitial)
	}
	if lib == nil {
		return nil, errors.New("nil NVML library")
	}
	if err := initError(lib.Init()); err != nil {
		return nil, err
	}
	b := &Backend{lib: lib, opts: o, log: o.logger}
	if err := b.inventory(); err != nil {
		if serr := nvmlError("shutting NVML down", lib.Shutdown()); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, err
	}
	return b, nil
}

// Close shuts NVML down. It is safe to call more than once; Run must have returned.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() { b.closeErr = nvmlError("shutting NVML down", b.lib.Shutdown()) })
	return b.closeErr
}

// Devices returns the inventory: every GPU by index, each followed by its MIG instances.
func (b *Backend) Devices() []health.Device { return b.devices }

// DriverVersion returns the NVIDIA driver version ("" when NVML does not say).
func (b *Backend) DriverVersion() string { return b.driverVersion }

// Skipped returns one error per GPU that NVML lists but that could not be identified (no handle
// or no UUID); such a GPU cannot be tracked, and the error says why.
func (b *Backend) Skipped() []error { return b.skipped }

func (b *Backend) inventory() error {
	if v, ret := b.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		b.driverVersion = v
	}
	count, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nvmlError("counting GPUs", ret)
	}
	for i := range count {
		handle, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			b.skip(fmt.Errorf("GPU %d: %w", i, nvmlError("getting its handle", ret)))
			continue
		}
		uuid, ret := handle.GetUUID()
		if ret != nvml.SUCCESS {
			b.skip(fmt.Errorf("GPU %d: %w", i, nvmlError("reading its UUID", ret)))
			continue
		}
		g := &gpu{handle: handle, dev: health.Device{UUID: uuid, Index: i, Minor: -1}}
		if minor, ret := handle.GetMinorNumber(); ret == nvml.SUCCESS {
			g.dev.Minor = minor
		}
		if name, ret := handle.GetName(); ret == nvml.SUCCESS {
			g.dev.Model = name
		}
		if pci, ret := handle.GetPciInfo(); ret == nvml.SUCCESS {
			g.dev.PCIBusID = busID(pci)
		}
		if err := b.migInventory(g); err != nil {
			b.skip(fmt.Errorf("GPU %d (%s): MIG instances: %w", i, uuid, err))
		}
		b.gpus = append(b.gpus, g)
		b.devices = append(b.devices, g.dev)
		b.devices = append(b.devices, g.migs...)
	}
	return nil
}

func (b *Backend) skip(err error) {
	b.log.Error(err, "GPU left out of the inventory")
	b.skipped = append(b.skipped, err)
}

// migInventory lists the MIG instances of a GPU in MIG mode.
func (b *Backend) migInventory(g *gpu) error {
	current, _, ret := g.handle.GetMigMode()
	if notSupported(ret) || (ret == nvml.SUCCESS && current != nvml.DEVICE_MIG_ENABLE) {
		return nil
	}
	if ret != nvml.SUCCESS {
		return nvmlError("reading MIG mode", ret)
	}
	n, ret := g.handle.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nvmlError("counting MIG devices", ret)
	}
	var errs []error
	for j := range n {
		mig, ret := g.handle.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // MIG device slots are sparse
		}
		if ret != nvml.SUCCESS {
			errs = append(errs, nvmlError(fmt.Sprintf("MIG device %d: getting its handle", j), ret))
			continue
		}
		uuid, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			errs = append(errs, nvmlError(fmt.Sprintf("MIG device %d: reading its UUID", j), ret))
			continue
		}
		gi, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			errs = append(errs, nvmlError(fmt.Sprintf("MIG device %s: reading its GPU instance", uuid), ret))
			continue
		}
		ci, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			errs = append(errs, nvmlError(fmt.Sprintf("MIG device %s: reading its compute instance", uuid), ret))
			continue
		}
		d := health.Device{
			UUID: uuid, Index: g.dev.Index, Minor: g.dev.Minor, PCIBusID: g.dev.PCIBusID,
			Model: g.dev.Model + " MIG",
			MIG:   &health.MIGPlacement{ParentUUID: g.dev.UUID, GPUInstance: uint32(gi), ComputeInstance: uint32(ci)},
		}
		if name, ret := mig.GetName(); ret == nvml.SUCCESS && name != "" {
			d.Model = name
		}
		g.migs = append(g.migs, d)
	}
	return errors.Join(errs...)
}

// busID reads the PCI bus ID NVML reports, preferring the long form.
func busID(p nvml.PciInfo) string {
	if s := cString(p.BusId[:]); s != "" {
		return s
	}
	return cString(p.BusIdLegacy[:])
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// sameHandle compares two device handles without panicking on handle types that are not
// comparable.
func sameHandle(a, b nvml.Device) bool {
	if a == nil || b == nil {
		return false
	}
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	if ta != tb || !ta.Comparable() {
		return false
	}
	return a == b
}

// OpenSystem opens the NVML library installed with the NVIDIA driver. Commands use it so that
// go-nvml stays behind this package's door.
func OpenSystem(opts ...Option) (*Backend, error) { return Open(nvml.New(), opts...) }
