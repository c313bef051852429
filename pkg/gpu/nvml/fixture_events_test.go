package nvml_test

import (
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// fakeSet is what the fixture knows of one event set: freed, and the types registered on it
// per GPU index.
type fakeSet struct {
	set   *mock.EventSet
	freed bool
	regs  map[int]uint64
}

// createEventSet answers EventSetCreate with a set whose Wait reads f.waits.
func (f *fixture) createEventSet() (nvml.EventSet, nvml.Return) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkLive("EventSetCreate")
	ret := f.eventSetRet
	if len(f.createRets) > 0 {
		ret, f.createRets = f.createRets[0], f.createRets[1:]
	}
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	fs := &fakeSet{regs: map[int]uint64{}}
	fs.set = &mock.EventSet{
		WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
			f.waitCalls.Add(1)
			f.checkLive("EventSet.Wait")
			f.mu.Lock()
			if fs.freed {
				f.t.Error("Wait on a freed event set")
			}
			f.mu.Unlock()
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
			f.mu.Lock()
			defer f.mu.Unlock()
			f.checkLive("EventSet.Free")
			if fs.freed {
				f.t.Error("event set freed twice")
			}
			fs.freed = true
			f.record("free")
			f.frees.Add(1)
			return nvml.SUCCESS
		},
	}
	f.sets = append(f.sets, fs)
	f.creates.Add(1)
	f.record("create")
	return fs.set, nvml.SUCCESS
}

// lastSet returns the event set created last (nil before any).
func (f *fixture) lastSet() *fakeSet {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sets) == 0 {
		return nil
	}
	return f.sets[len(f.sets)-1]
}

// registeredOn returns the types registered for GPU i on fs.
func (f *fixture) registeredOn(fs *fakeSet, i int) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fs.regs[i]
}

// setOf finds the fixture's record of an event set.
func (f *fixture) setOf(set nvml.EventSet) *fakeSet {
	for _, fs := range f.sets {
		if fs.set == set {
			return fs
		}
	}
	f.t.Errorf("unknown event set %p", set)
	return &fakeSet{regs: map[int]uint64{}}
}

// wireEvents answers the event registration calls of GPU i.
func (f *fixture) wireEvents(i int, d *server.Device, st *gpuState) {
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ret := f.answer(st, "events"); ret != nvml.SUCCESS {
			return 0, ret
		}
		return st.supportedEvents, nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.checkLive("RegisterEvents")
		ret := st.registerRet
		if len(st.registerRets) > 0 {
			ret, st.registerRets = st.registerRets[0], st.registerRets[1:]
		}
		switch {
		case ret != nvml.SUCCESS:
			return ret
		case mask&st.refuse != 0:
			return nvml.ERROR_NOT_SUPPORTED
		}
		st.registered |= mask
		f.setOf(set).regs[i] |= mask
		return nvml.SUCCESS
	}
}

// eventsAtStart reports whether Run is to wait for events as soon as it starts: the first
// event set is created, and no test made registering fail at start.
func (f *fixture) eventsAtStart() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.eventSetRet != nvml.SUCCESS || len(f.createRets) > 0 {
		return false
	}
	for _, st := range f.gpus {
		if st.registerRet != nvml.SUCCESS || len(st.registerRets) > 0 {
			return false
		}
	}
	return true
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
