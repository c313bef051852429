package nvml

import (
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Defaults for the options.
const (
	DefaultSamplePeriod   = 10 * time.Second
	DefaultEventWait      = time.Second
	DefaultBackoffInitial = 100 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
	DefaultStartAttempts  = 5
	DefaultStartBackoff   = time.Second
)

// Backend feeds the one sink every backend feeds (gpu.Sink; it never calls Reboot: a reboot
// ends the process that watches), and asks it for more through CheckSink.
var _ gpuapi.Backend = (*Backend)(nil)

type options struct {
	samplePeriod   time.Duration
	eventWait      time.Duration
	backoffInitial time.Duration
	backoffMax     time.Duration
	startAttempts  int
	startBackoff   time.Duration
	inventoryCheck time.Duration
	// expectedNVLinks is how many NVLinks each GPU is expected to have up (0: unknown).
	expectedNVLinks int
	clock           clock.Clock
	logger          logr.Logger
	// fabricInfoV makes the versioned fabric call (fabric.go); tests replace it, as go-nvml's
	// mock cannot answer that call.
	fabricInfoV fabricInfoVFunc
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

// WithStartRetries sets how often Run tries to create the event set and register the GPUs on it
// before it gives up, and the first delay between tries, which doubles up to the largest wait
// backoff (defaults DefaultStartAttempts, DefaultStartBackoff). The node may still be
// initialising when the agent starts.
func WithStartRetries(attempts int, initial time.Duration) Option {
	return func(o *options) { o.startAttempts, o.startBackoff = attempts, initial }
}

// WithExpectedNVLinks sets how many NVLinks each GPU is expected to have up: the model's link
// count, or the configuration's. Links 0 to n-1 that NVML has (their state answers) but that were
// not active when first scanned are then watched too, and reported down until they come up: a
// link dead from boot is a fault. Without it (or with 0) only the links active at the first scan
// are watched, as a card without bridges or a passthrough VM has inactive links and no fault.
func WithExpectedNVLinks(n int) Option { return func(o *options) { o.expectedNVLinks = n } }

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
	library       string
	gpus          []*gpu
	devices       []health.Device
	skipped       []error
	// sym records the optional NVML functions the driver lacks; eventsOff says why events
	// cannot be watched at all ("" when they can). Both are set by Open.
	sym       symbols
	eventsOff string

	stats stats
	// sampling and waiting record since when a sampling round, and an EventSet.Wait, have been in
	// NVML (Stalled).
	sampling, waiting inFlight

	// gate coordinates Run's loops with resets (see session.go); session serialises resets, the
	// re-initialisations after them and Close. closed is set by Close, under session.
	gate    *gate
	session chan struct{}
	closed  bool

	// gone is set once a loop saw the driver go away (driveraway.go): Run returns it.
	gone atomic.Pointer[DriverGoneError]
	// migChanged is set by a MIG configuration-change event; inventoryCheckedAt is when the
	// MIG layout was last compared with the inventory (migchange.go).
	migChanged         atomic.Bool
	inventoryCheckedAt atomic.Int64

	closeOnce sync.Once
	closeErr  error
}

// gpu is one physical GPU of the inventory and the sampler's memory of it.
type gpu struct {
	// handle is replaced after every reset (see reacquire), while the loops of Run are parked;
	// nil when the GPU did not come back (it is then lost).
	handle nvml.Device
	dev    health.Device
	migs   []health.Device

	// mu serialises reads that compare with the previous reading (ECC totals) and the lazily
	// discovered NVLink set, between the sampler and the event loop. links are the NVLinks whose
	// state counts (see trackedLinks); fabricPending is set while Fabric Manager has not
	// finished with the GPU, and no link counts yet.
	mu            sync.Mutex
	ecc           eccTotals
	eccValid      bool
	links         []int
	linksScanned  bool
	fabricPending bool

	// lost is set once the backend has reported the GPU lost: it is not registered on a new
	// event set again.
	lost atomic.Bool
	// resetRequired is set once a sampling round's readings answered ERROR_RESET_REQUIRED, until
	// a round reads the GPU again: the driver's own evidence of a reset (SignalReset then).
	resetRequired atomic.Bool
	// resetDone is set by CommandResetter after a reset, until the sampler reports it.
	resetDone atomic.Bool

	// off names the readings not taken on this GPU and why: the driver lacks their functions,
	// or ECC is off. fault is SignalLost or SignalResetRequired when NVML said so while Open
	// looked at the GPU (0 otherwise); Run reports it first. Both are set by Open only.
	off   map[string]string
	fault health.SignalKind
	// eccDisabled is set when the GPU's ECC mode is off (or it has no ECC): its ECC events
	// never come. migEnabled is set when the GPU is in MIG mode. rowRemapper is set for an
	// Ampere or later GPU, which remaps rows instead of retiring pages. All set by Open only.
	eccDisabled bool
	migEnabled  bool
	rowRemapper bool
	// migComplete is set when Open read the GPU's whole MIG layout: only then is it compared
	// with NVML's later (a device Open could not read would otherwise look new every time).
	migComplete bool
	// checksOff are the checks the sampler found it cannot run on this GPU (NOT_SUPPORTED, or a
	// reading not believed) and has told the sink so, until a reading is taken again. Only the
	// sampler touches it.
	checksOff map[health.Check]bool
}

type eccTotals struct{ corrected, uncorrected uint64 }

// Open initialises NVML and takes the inventory. The caller owns the Backend and must Close it;
// on error nothing is left open. Without an NVIDIA driver the error wraps ErrNoDriver.
func Open(lib nvml.Interface, opts ...Option) (*Backend, error) {
	o := newOptions(opts)
	if lib == nil {
		return nil, errors.New("nil NVML library")
	}
	if err := initError(lib.Init()); err != nil {
		return nil, err
	}
	b := &Backend{lib: lib, opts: o, log: o.logger, sym: lookupSymbols(lib), gate: newGate(), session: make(chan struct{}, 1)}
	b.eventsOff = b.sym.eventsMissing()
	if err := b.inventory(); err != nil {
		if serr := nvmlError("shutting NVML down", lib.Shutdown()); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, err
	}
	b.logOff()
	b.inventoryCheckedAt.Store(o.clock.Now().UnixNano())
	return b, nil
}

// newOptions applies opts over the defaults; a value out of range keeps its default.
func newOptions(opts []Option) options {
	o := options{
		samplePeriod:   DefaultSamplePeriod,
		eventWait:      DefaultEventWait,
		backoffInitial: DefaultBackoffInitial,
		backoffMax:     DefaultBackoffMax,
		startAttempts:  DefaultStartAttempts,
		startBackoff:   DefaultStartBackoff,
		inventoryCheck: DefaultInventoryCheck,
		clock:          clock.RealClock{},
		logger:         logr.Discard(),
		fabricInfoV:    goNVMLFabricInfoV,
	}
	for _, opt := range opts {
		opt(&o)
	}
	positiveOr(&o.samplePeriod, DefaultSamplePeriod)
	positiveOr(&o.eventWait, DefaultEventWait)
	positiveOr(&o.backoffInitial, DefaultBackoffInitial)
	if o.backoffMax < o.backoffInitial {
		o.backoffMax = max(DefaultBackoffMax, o.backoffInitial)
	}
	positiveOr(&o.startAttempts, DefaultStartAttempts)
	positiveOr(&o.startBackoff, DefaultStartBackoff)
	positiveOr(&o.inventoryCheck, DefaultInventoryCheck)
	o.expectedNVLinks = min(max(o.expectedNVLinks, 0), nvml.NVLINK_MAX_LINKS)
	return o
}

// positiveOr sets *v to def when an option left it zero or negative.
func positiveOr[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Close shuts NVML down. It is safe to call more than once; Run must have returned. It waits for
// a reset in progress; resets after it fail. When NVML is down after a reset (Init failed)
// there is nothing to shut down.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		b.session <- struct{}{}
		defer b.unlockSession()
		b.closed = true
		if _, down := b.gate.downState(); down != nil {
			return
		}
		b.closeErr = nvmlError("shutting NVML down", b.lib.Shutdown())
	})
	return b.closeErr
}

// Devices returns the inventory: every GPU by index, each followed by its MIG instances.
func (b *Backend) Devices() []health.Device { return b.devices }

// DriverVersion returns the NVIDIA driver version ("" when NVML does not say).
func (b *Backend) DriverVersion() string { return b.driverVersion }

// Skipped returns one error per GPU that NVML lists but that could not be identified (no handle
// or no UUID), and per GPU whose MIG devices could not all be listed. A GPU that could not be
// identified cannot be tracked; when it is broken (lost, in need of a reset, or failing with an
// unknown error) its error wraps ErrGPULost, and the node has a bad GPU that no UUID names.
func (b *Backend) Skipped() []error { return b.skipped }

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
