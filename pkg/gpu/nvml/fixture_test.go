package nvml_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	testingclock "k8s.io/utils/clock/testing"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The tests drive go-nvml's own mock: a dgxh100 server fixture for inventory and MIG, with the
// function fields it leaves unset (events, ECC, temperatures, ...) set here to read gpuState.

var start = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const samplePeriod = 10 * time.Second

// gpuState is what one mocked GPU answers. Fields are guarded by fixture.mu.
type gpuState struct {
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
	linkErrors             []uint64           // per link, per counter
	recovery               uint32
	lost                   bool
	// resetRequired makes every call but GetUUID answer ERROR_RESET_REQUIRED, nvml.h's "The
	// GPU requires a reset before it can be used again".
	resetRequired bool
	// eccCurrent and eccPending answer GetEccMode. An H100 has ECC on. With ECC off, nvml.h's
	// "Requires ECC Mode to be enabled" makes the ECC totals answer ERROR_NOT_SUPPORTED.
	eccCurrent, eccPending nvml.EnableState
	supportedEvents        uint64
	// registerRet answers RegisterEvents for a mask other than XID only.
	registerRet nvml.Return
	registered  uint64
	// unsupported names readings (gpunvml.Reading*) that answer ERROR_NOT_SUPPORTED.
	unsupported map[string]bool
	// failing names readings that answer ERROR_UNKNOWN.
	failing map[string]bool
	// rets names readings that answer the given code.
	rets map[string]nvml.Return
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
	frees     atomic.Int64
	shutdowns atomic.Int64
	// eventSetRet answers EventSetCreate.
	eventSetRet nvml.Return
	// missing names the C symbols the fake libnvidia-ml lacks (LookupSymbol fails for them).
	missing map[string]bool
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
	f.srv.ShutdownFunc = func() nvml.Return {
		f.shutdowns.Add(1)
		return nvml.SUCCESS
	}
	f.srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		if f.eventSetRet != nvml.SUCCESS {
			return nil, f.eventSetRet
		}
		return &mock.EventSet{
			WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
				f.waitCalls.Add(1)
				timer := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
				defer timer.Stop()
				select {
				case r := <-f.waits:
					return r.data, r.ret
				case <-timer.C:
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return {
				f.frees.Add(1)
				return nvml.SUCCESS
			},
		}, nvml.SUCCESS
	}
	for i := range f.srv.Devices {
		st := &gpuState{
			temperature: 40, slowdown: 87, shutdown: 92, powerMw: 120000, limitMw: 700000,
			eccCurrent: nvml.FEATURE_ENABLED, eccPending: nvml.FEATURE_ENABLED,
			links:           make([]nvml.EnableState, 2),
			linkErrors:      make([]uint64, 2),
			supportedEvents: nvml.EventTypeAll,
			registerRet:     nvml.SUCCESS,
			unsupported:     map[string]bool{},
			failing:         map[string]bool{},
			rets:            map[string]nvml.Return{},
		}
		for l := range st.links {
			st.links[l] = nvml.FEATURE_ENABLED
		}
		f.gpus = append(f.gpus, st)
		f.wireDevice(f.device(i), st)
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

// answer is the return code of a reading: lost, unsupported, failing or fine.
func (f *fixture) answer(st *gpuState, reading string) nvml.Return {
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

func (f *fixture) wireDevice(d *server.Device, st *gpuState) {
	uuid := d.UUID
	d.GetUUIDFunc = func() (string, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if st.lost {
			return "", nvml.ERROR_GPU_IS_LOST
		}
		if ret := st.rets["uuid"]; ret != nvml.SUCCESS {
			return "", ret
		}
		return uuid, nvml.SUCCESS
	}
	// The fixture leaves the bus ID out of GetPciInfo; NVML fills it.
	pci := d.GetPciInfoFunc
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p, ret := pci()
		for i, c := range d.PciBusID {
			p.BusId[i] = int8(c)
		}
		return p, ret
	}
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "events"); ret != nvml.SUCCESS {
			return 0, ret
		}
		return st.supportedEvents, nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		if mask != nvml.EventTypeXidCriticalError && st.registerRet != nvml.SUCCESS {
			return st.registerRet
		}
		st.registered = mask
		return nvml.SUCCESS
	}
	d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "eccMode"); ret != nvml.SUCCESS {
			return 0, 0, ret
		}
		return st.eccCurrent, st.eccPending, nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, counter nvml.EccCounterType) (uint64, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if counter != nvml.VOLATILE_ECC {
			f.t.Errorf("ECC counter type %d read, want volatile", counter)
		}
		if ret := f.answer(st, gpunvml.ReadingECC); ret != nvml.SUCCESS {
			return 0, ret
		}
		if st.eccCurrent != nvml.FEATURE_ENABLED {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		if typ == nvml.MEMORY_ERROR_TYPE_CORRECTED {
			return st.corrected, nvml.SUCCESS
		}
		return st.uncorrected, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingRemappedRows); ret != nvml.SUCCESS {
			return 0, 0, false, false, ret
		}
		return 0, 0, st.rowsPending, st.rowsFailure, nvml.SUCCESS
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingRetiredPages); ret != nvml.SUCCESS {
			return 0, ret
		}
		if st.pagesPending {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.temperature, f.answer(st, gpunvml.ReadingTemperature)
	}
	d.GetTemperatureThresholdFunc = func(th nvml.TemperatureThresholds) (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "thresholds"); ret != nvml.SUCCESS {
			return 0, ret
		}
		if th == nvml.TEMPERATURE_THRESHOLD_SLOWDOWN {
			return st.slowdown, nvml.SUCCESS
		}
		return st.shutdown, nvml.SUCCESS
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.powerMw, f.answer(st, gpunvml.ReadingPower)
	}
	d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.limitMw, f.answer(st, gpunvml.ReadingPower)
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.reasons, f.answer(st, gpunvml.ReadingClockEvents)
	}
	// Drivers before 535 name the same bits throttle reasons.
	d.GetCurrentClocksThrottleReasonsFunc = d.GetCurrentClocksEventReasonsFunc
	d.GetPcieReplayCounterFunc = func() (int, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return st.replays, f.answer(st, gpunvml.ReadingPCIeReplays)
	}
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingNVLink); ret != nvml.SUCCESS {
			return 0, ret
		}
		if link >= len(st.links) {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return st.links[link], nvml.SUCCESS
	}
	d.GetNvLinkErrorCounterFunc = func(link int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, gpunvml.ReadingNVLink); ret != nvml.SUCCESS {
			return 0, ret
		}
		if c == nvml.NVLINK_ERROR_DL_CRC_FLIT {
			return st.linkErrors[link], nvml.SUCCESS
		}
		return 0, nvml.ERROR_NOT_SUPPORTED // the other counters: no data
	}
	d.GetFieldValuesFunc = func(values []nvml.FieldValue) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "fieldValues"); ret != nvml.SUCCESS {
			return ret
		}
		for i := range values {
			if values[i].FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
				f.t.Errorf("field %d read, want FI_DEV_GET_GPU_RECOVERY_ACTION", values[i].FieldId)
			}
			// NVML reports an unsupported field in the field's own return code.
			values[i].NvmlReturn = uint32(f.answer(st, gpunvml.ReadingRecoveryAction))
			values[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
			values[i].Value = [8]byte{byte(st.recovery)}
		}
		return nvml.SUCCESS
	}
}

// enableMIG puts GPU i in MIG mode with n one-slice instances through the fixture's own MIG
// calls, and serves them as MIG device handles. It returns the MIG devices' UUIDs.
func (f *fixture) enableMIG(i, n int) []string {
	f.t.Helper()
	d := f.device(i)
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		f.t.Fatalf("SetMigMode: %v", ret)
	}
	giProfile, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		f.t.Fatalf("GetGpuInstanceProfileInfo: %v", ret)
	}
	var migs []nvml.Device
	var uuids []string
	for j := range n {
		gi, ret := d.CreateGpuInstance(&giProfile)
		if ret != nvml.SUCCESS {
			f.t.Fatalf("CreateGpuInstance: %v", ret)
		}
		ciProfile, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			f.t.Fatalf("GetComputeInstanceProfileInfo: %v", ret)
		}
		ci, ret := gi.CreateComputeInstance(&ciProfile)
		if ret != nvml.SUCCESS {
			f.t.Fatalf("CreateComputeInstance: %v", ret)
		}
		giInfo, _ := gi.GetInfo()
		ciInfo, _ := ci.GetInfo()
		uuid := fmt.Sprintf("MIG-%08x-0000-4000-8000-%012x", i, j)
		uuids = append(uuids, uuid)
		migs = append(migs, &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
			GetNameFunc:              func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3 MIG 1g.10gb", nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(giInfo.Id), nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(ciInfo.Id), nvml.SUCCESS },
		})
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return migs[j], nvml.SUCCESS
	}
	return uuids
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
func (f *fixture) run(b *gpunvml.Backend, sink gpunvml.Sink) (stop func()) {
	f.t.Helper()
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
			if f.eventSetRet == nvml.SUCCESS && f.frees.Load() != 1 {
				f.t.Errorf("event set freed %d times, want 1", f.frees.Load())
			}
		})
	}
	f.t.Cleanup(stop)
	waitFor(f.t, "the first sampling round", func() bool { return b.Stats().Rounds >= 1 })
	return stop
}

// step advances the fake clock by one sample period and waits for the round it starts.
func (f *fixture) step(b *gpunvml.Backend) {
	f.t.Helper()
	want := b.Stats().Rounds + 1
	f.clock.Step(samplePeriod)
	waitFor(f.t, "a sampling round", func() bool { return b.Stats().Rounds >= want })
}

// send queues one Wait result.
func (f *fixture) send(data nvml.EventData, ret nvml.Return) {
	f.waits <- waitResult{data: data, ret: ret}
}

// event queues an event on GPU i for the whole GPU.
func (f *fixture) event(i int, typ, data uint64) {
	f.send(nvml.EventData{Device: f.device(i), EventType: typ, EventData: data,
		GpuInstanceId: health.NoInstance, ComputeInstanceId: health.NoInstance}, nvml.SUCCESS)
}

// waitFor polls cond until it holds or a generous deadline passes: no timed assertions.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// recorder is a Sink that keeps everything.
type recorder struct {
	mu          sync.Mutex
	signals     []health.Signal
	unmonitored map[string]bool
}

func newRecorder() *recorder { return &recorder{unmonitored: map[string]bool{}} }

func (r *recorder) Signal(s health.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signals = append(r.signals, s)
}

func (r *recorder) SetUnmonitored(uuid string, unmonitored bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unmonitored[uuid] = unmonitored
}

// take returns and forgets the signals so far.
func (r *recorder) take() []health.Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.signals
	r.signals = nil
	return s
}

func (r *recorder) isUnmonitored(uuid string) (unmonitored, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	unmonitored, known = r.unmonitored[uuid]
	return
}

// waitSignals waits until the recorder holds a signal matching last, and returns everything
// recorded so far (and forgets it).
func (r *recorder) waitSignals(t *testing.T, what string, last func(health.Signal) bool) []health.Signal {
	t.Helper()
	var got []health.Signal
	waitFor(t, what, func() bool {
		got = append(got, r.take()...)
		return slices.ContainsFunc(got, last)
	})
	return got
}

func isKind(kind health.SignalKind, uuid string) func(health.Signal) bool {
	return func(s health.Signal) bool { return s.Kind == kind && s.Device == uuid }
}

// without drops the signals of the given kinds (sampling rounds are noise in event tests).
func without(sigs []health.Signal, kinds ...health.SignalKind) []health.Signal {
	return slices.DeleteFunc(slices.Clone(sigs), func(s health.Signal) bool { return slices.Contains(kinds, s.Kind) })
}

var errNotFound = errors.New("not found")

// deviceStatus finds a device in a snapshot.
func deviceStatus(snap health.Snapshot, uuid string) (health.DeviceStatus, error) {
	for _, d := range snap.Devices {
		if d.Device.UUID == uuid {
			return d, nil
		}
	}
	return health.DeviceStatus{}, errNotFound
}
