package nvml_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	testingclock "k8s.io/utils/clock/testing"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// The tests drive go-nvml's own mock: a dgxh100 server fixture for inventory and MIG, with the
// function fields it leaves unset (events, ECC, temperatures, ...) set here to read gpuState.
// fixture_device_test.go answers the device calls, fixture_events_test.go the event sets, as
// nvml.h documents them.

var start = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const samplePeriod = 10 * time.Second

// gpuState is what one mocked GPU answers. Fields are guarded by fixture.mu.
type gpuState struct {
	// hang, when set, makes GetTemperature block until it is closed.
	hang                   chan struct{}
	corrected, uncorrected uint64
	rowsPending            bool
	rowsFailure            bool
	pagesPending           bool
	temperature            uint32
	slowdown, shutdown     uint32
	powerMw, limitMw       uint32
	reasons                uint64
	replays                int
	links                  []nvml.EnableState // one per NVLink
	linkErrors             []uint64           // per link: NVLINK_ERROR_DL_CRC_FLIT
	linkECC                []uint64           // per link: NVLINK_ERROR_DL_ECC_DATA (Hopper)
	// fabric is GetGpuFabricInfo's state: an HGX H100 that Fabric Manager has registered is
	// GPU_FABRIC_STATE_COMPLETED. fabricStatus is its status, fabricMask the versioned call's
	// health mask (fabricInfoV answers it).
	fabric       uint8
	fabricStatus uint32
	fabricMask   uint32
	// histogram answers GetRowRemapperHistogram, sram GetSramEccErrorStatus; pcie is the link
	// as trained (gen, width) and the most it can (maxGen, maxWidth).
	histogram                      nvml.RowRemapperHistogramValues
	sram                           nvml.EccSramErrorStatus
	pcieGen, pcieWidth             int
	pcieMaxGen, pcieMaxWidth       int
	recoveriesOK, recoveriesFailed []uint64 // per link: the recovery-count field values
	recoveryValueType              nvml.ValueType
	// serial answers GetSerial: the board's serial, 13 digits on NVIDIA's data-center boards.
	serial string
	// vbios answers GetVbiosVersion: the board's VBIOS version, as an H100 SXM reports it.
	vbios string
	// arch answers GetArchitecture. Ampere and later remap rows instead of retiring pages:
	// GetRetiredPagesPendingStatus answers ERROR_NOT_SUPPORTED on them.
	arch nvml.DeviceArchitecture
	// mig is set by enableMIG. nvml.h: with MIG on, GetRemappedRows answers
	// ERROR_NOT_SUPPORTED ("If MIG is enabled"), and so do volatile ECC counts read through the
	// GPU's handle.
	mig      bool
	recovery uint32
	lost     bool
	// uuidCached makes GetUUID answer from NVML's cache even once the GPU is lost, as NVML
	// may; readings that touch the hardware answer ERROR_GPU_IS_LOST.
	uuidCached bool
	// resetRequired makes every call but GetUUID answer ERROR_RESET_REQUIRED, nvml.h's "The
	// GPU requires a reset before it can be used again".
	resetRequired bool
	// eccCurrent and eccPending answer GetEccMode. An H100 has ECC on. With ECC off, nvml.h's
	// "Requires ECC Mode to be enabled" makes the ECC totals answer ERROR_NOT_SUPPORTED.
	eccCurrent, eccPending nvml.EnableState
	supportedEvents        uint64
	// refuse makes RegisterEvents answer ERROR_NOT_SUPPORTED for a mask with any of these types,
	// registering none of the mask (nvml.h: "None of the requested eventTypes are registered in
	// that case"). registerRets answer the next RegisterEvents calls, registerRet every later one
	// when it is not SUCCESS (ERROR_UNKNOWN: "event set is in undefined state").
	refuse       uint64
	registerRets []nvml.Return
	registerRet  nvml.Return
	// registered is every type registered, on any event set.
	registered uint64
	// unsupported names readings (gpunvml.Reading*) that answer ERROR_NOT_SUPPORTED.
	unsupported map[string]bool
	// failing names readings that answer ERROR_UNKNOWN.
	failing map[string]bool
	// rets names readings that answer the given code.
	rets map[string]nvml.Return
	// gone, when not SUCCESS, answers DeviceGetHandleByUUID: the GPU did not come back after a
	// reset.
	gone nvml.Return
	// eccLowReads makes the next that many ECC total reads answer 0: a glitch.
	eccLowReads int
}

type waitResult struct {
	data nvml.EventData
	ret  nvml.Return
}

type fixture struct {
	t     *testing.T
	srv   *server.Server
	clock *testingclock.FakeClock

	mu   sync.Mutex
	gpus []*gpuState

	// waits feeds EventSet.Wait; with nothing queued, Wait times out after its timeout.
	waits     chan waitResult
	waitCalls atomic.Int64
	creates   atomic.Int64
	frees     atomic.Int64
	shutdowns atomic.Int64
	// createRets answer the next EventSetCreate calls, eventSetRet every later one. sets are the
	// event sets created, in order. Both guarded by mu.
	createRets  []nvml.Return
	eventSetRet nvml.Return
	sets        []*fakeSet
	// missing names the C symbols the fake libnvidia-ml lacks (LookupSymbol fails for them).
	missing map[string]bool
	// live is set between a successful Init and Shutdown: every device and event set call
	// made while it is not fails the test. initRets answer the next Init calls (SUCCESS after
	// them); inits counts the calls. Both guarded by mu.
	live     atomic.Bool
	initRets []nvml.Return
	inits    int
	// calls records, in order, the calls around a reset: "init", "init failed", "shutdown",
	// "create", "free", "handle <index>", and what tests add ("command"). Guarded by callsMu.
	callsMu sync.Mutex
	calls   []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{
		t:           t,
		srv:         dgxh100.New(),
		clock:       testingclock.NewFakeClock(start),
		waits:       make(chan waitResult, 16),
		eventSetRet: nvml.SUCCESS,
		missing:     map[string]bool{},
	}
	f.srv.LookupSymbolFunc = func(name string) error {
		if f.missing[name] {
			return fmt.Errorf("undefined symbol: %s", name)
		}
		return nil
	}
	f.srv.InitFunc = func() nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.inits++
		ret := nvml.SUCCESS
		if len(f.initRets) > 0 {
			ret, f.initRets = f.initRets[0], f.initRets[1:]
		}
		if ret != nvml.SUCCESS {
			f.record("init failed")
			return ret
		}
		f.record("init")
		f.live.Store(true)
		return nvml.SUCCESS
	}
	f.srv.ShutdownFunc = func() nvml.Return {
		f.shutdowns.Add(1)
		f.record("shutdown")
		f.live.Store(false)
		return nvml.SUCCESS
	}
	byUUID := f.srv.DeviceGetHandleByUUIDFunc
	f.srv.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.checkLive("DeviceGetHandleByUUID")
		for i, st := range f.gpus {
			if f.uuid(i) != uuid {
				continue
			}
			f.record(fmt.Sprintf("handle %d", i))
			if st.gone != nvml.SUCCESS {
				return nil, st.gone
			}
		}
		return byUUID(uuid)
	}
	f.srv.EventSetCreateFunc = f.createEventSet
	for i := range f.srv.Devices {
		st := &gpuState{
			temperature: 40, slowdown: 87, shutdown: 92, powerMw: 120000, limitMw: 700000,
			eccCurrent: nvml.FEATURE_ENABLED, eccPending: nvml.FEATURE_ENABLED,
			links:      make([]nvml.EnableState, 2),
			linkErrors: make([]uint64, 2),
			linkECC:    make([]uint64, 2),
			fabric:     nvml.GPU_FABRIC_STATE_COMPLETED,
			histogram:  nvml.RowRemapperHistogramValues{Max: 640},
			pcieGen:    5, pcieWidth: 16, pcieMaxGen: 5, pcieMaxWidth: 16,
			recoveriesOK:      make([]uint64, 2),
			recoveriesFailed:  make([]uint64, 2),
			recoveryValueType: nvml.VALUE_TYPE_UNSIGNED_LONG_LONG,
			arch:              nvml.DEVICE_ARCH_HOPPER,
			serial:            fmt.Sprintf("16509230%05d", i),
			vbios:             "96.00.89.00.01",
			supportedEvents:   nvml.EventTypeAll,
			registerRet:       nvml.SUCCESS,
			unsupported:       map[string]bool{},
			failing:           map[string]bool{},
			rets:              map[string]nvml.Return{},
		}
		for l := range st.links {
			st.links[l] = nvml.FEATURE_ENABLED
		}
		f.gpus = append(f.gpus, st)
		f.wireDevice(i, st)
	}
	return f
}

func (f *fixture) device(i int) *server.Device { return f.srv.Devices[i].(*server.Device) }

func (f *fixture) uuid(i int) string { return f.device(i).UUID }

// update changes GPU i's state under the fixture's lock.
func (f *fixture) update(i int, change func(*gpuState)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f.gpus[i])
}

// record appends to the call log.
func (f *fixture) record(call string) {
	f.callsMu.Lock()
	defer f.callsMu.Unlock()
	f.calls = append(f.calls, call)
}

// callLog returns the call log so far.
func (f *fixture) callLog() []string {
	f.callsMu.Lock()
	defer f.callsMu.Unlock()
	return slices.Clone(f.calls)
}

// checkLive fails the test when NVML is called while it is shut down: a handle or an event
// set of the old session is used, or a loop did not wait for the reset.
func (f *fixture) checkLive(call string) {
	if !f.live.Load() {
		f.t.Errorf("%s called while NVML is shut down", call)
	}
}

// initCalls returns how often Init was called.
func (f *fixture) initCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inits
}

// answer is the return code of a reading: lost, unsupported, failing or fine.
func (f *fixture) answer(st *gpuState, reading string) nvml.Return {
	f.checkLive(reading)
	switch {
	case st.lost:
		return nvml.ERROR_GPU_IS_LOST
	case st.resetRequired:
		return nvml.ERROR_RESET_REQUIRED
	case st.unsupported[reading]:
		return nvml.ERROR_NOT_SUPPORTED
	case st.failing[reading]:
		return nvml.ERROR_UNKNOWN
	case st.rets[reading] != nvml.SUCCESS:
		return st.rets[reading]
	}
	return nvml.SUCCESS
}

func (f *fixture) open(opts ...gpunvml.Option) *gpunvml.Backend {
	f.t.Helper()
	opts = append([]gpunvml.Option{
		gpunvml.WithClock(f.clock),
		gpunvml.WithSamplePeriod(samplePeriod),
		gpunvml.WithEventWait(5 * time.Millisecond),
		gpunvml.WithWaitBackoff(time.Second, 4*time.Second),
	}, opts...)
	b, err := gpunvml.Open(f.srv, opts...)
	if err != nil {
		f.t.Fatalf("Open: %v", err)
	}
	f.t.Cleanup(func() {
		if err := b.Close(); err != nil {
			f.t.Errorf("Close: %v", err)
		}
	})
	return b
}

// run starts b.Run and waits for the first sampling round; stopping it is registered as a
// cleanup that also checks Run's result and that the event set was freed.
func (f *fixture) run(b *gpunvml.Backend, sink gpuapi.Sink) (stop func()) {
	f.t.Helper()
	events := f.eventsAtStart() // before Run consumes the queued answers
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx, sink) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					f.t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				f.t.Fatal("Run did not return after its context was cancelled")
			}
			if c, fr := f.creates.Load(), f.frees.Load(); c != fr {
				f.t.Errorf("%d event sets created, %d freed: want every one freed", c, fr)
			}
		})
	}
	f.t.Cleanup(stop)
	healthtest.Eventually(f.t, "the first sampling round", func() bool { return b.Stats().Rounds >= 1 })
	if events {
		// Registration runs in the event loop's goroutine: wait until it waits for events.
		healthtest.Eventually(f.t, "the first Wait", func() bool { return f.waitCalls.Load() > 0 })
	}
	return stop
}

// step advances the fake clock by one sample period and waits for the round it starts.
func (f *fixture) step(b *gpunvml.Backend) {
	f.t.Helper()
	want := b.Stats().Rounds + 1
	f.clock.Step(samplePeriod)
	healthtest.Eventually(f.t, "a sampling round", func() bool { return b.Stats().Rounds >= want })
}

// stepUntil steps the fake clock by d until cond holds. The backend may make a timer after any
// one step, so it keeps stepping rather than step once.
func (f *fixture) stepUntil(what string, d time.Duration, cond func() bool) {
	f.t.Helper()
	healthtest.Eventually(f.t, what, func() bool {
		if cond() {
			return true
		}
		f.clock.Step(d)
		return false
	})
}
