package deviceapi

import (
	"slices"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// TestApplySendsGPUsThatComeAndGo: the Monitor's devices are fixed at start but for those a
// checkpoint restores (TestWatchSendsAGPUThatARestoreAdds); a GPU that leaves a snapshot is
// sent as DELETED with its last state, so that a watcher's list never keeps a GPU the server no
// longer lists.
func TestApplySendsGPUsThatComeAndGo(t *testing.T) {
	snap := func(uuids ...string) health.Snapshot {
		var s health.Snapshot
		for i, u := range uuids {
			s.Devices = append(s.Devices, health.DeviceStatus{Device: health.Device{UUID: u, Index: i}})
		}
		return s
	}
	s := New(nil, Options{})
	s.apply(snap("GPU-A", "GPU-B"))
	w, initial, err := s.admit()
	if err != nil {
		t.Fatal(err)
	}
	if len(initial) != 2 {
		t.Fatalf("initial %d GPUs, want 2", len(initial))
	}
	s.apply(snap("GPU-B", "GPU-C"))
	var got []string
	for range 2 {
		ev := <-w.events
		got = append(got, ev.GetType()+" "+ev.GetObject().GetSpec().GetUuid())
	}
	if want := []string{"ADDED GPU-C", "DELETED GPU-A"}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	if len(w.events) != 0 {
		t.Errorf("GPU-B did not change, yet %d more events", len(w.events))
	}
	if gpus, _ := s.list(); len(gpus) != 2 || gpus[0].GetName() != "gpu-b" || gpus[1].GetName() != "gpu-c" {
		t.Errorf("listed %v", gpus)
	}
}
