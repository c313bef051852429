package health_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestMonitorCoalescesAndKeepsTransitionsInOrder(t *testing.T) {
	devs := []health.Device{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}}
	tr, err := health.NewTracker(health.DefaultPolicy(), devs)
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	sub := m.Subscribe()
	defer sub.Close()

	u, ok := sub.Next()
	if !ok || len(u.Snapshot.Devices) != 2 || len(u.Transitions) != 0 {
		t.Fatalf("first update = %+v, %v; want the initial snapshot of 2 devices and no transitions", u, ok)
	}
	if _, ok := sub.Next(); ok {
		t.Fatal("an update is pending although nothing changed")
	}

	at := time.Unix(100, 0)
	for range 10_000 {
		m.Signal(health.XIDSignal("GPU-a", 79, at))
	}
	m.Signal(health.Signal{Kind: health.SignalReset, Device: "GPU-b", Time: at})
	m.Signal(health.XIDSignal("GPU-b", 48, at.Add(time.Second)))
	m.Signal(health.Signal{Kind: health.SignalReset, Device: "GPU-b", Time: at.Add(2 * time.Second)})

	select {
	case <-sub.C():
	default:
		t.Fatal("no notification after changes")
	}
	u, ok = sub.Next()
	if !ok {
		t.Fatal("no update after changes")
	}
	var got []string
	for _, tr := range u.Transitions {
		got = append(got, tr.Device.UUID+":"+tr.From.String()+">"+tr.To.String())
	}
	want := []string{"GPU-a:Healthy>Unhealthy", "GPU-b:Healthy>Unhealthy", "GPU-b:Unhealthy>Healthy"}
	if len(got) != len(want) {
		t.Fatalf("transitions = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("transitions = %v, want %v", got, want)
		}
	}
	if h := u.Snapshot.Devices[0].Health; h != health.Unhealthy {
		t.Errorf("GPU-a health in latest snapshot = %v, want Unhealthy", h)
	}
	if h := u.Snapshot.Devices[1].Health; h != health.Healthy {
		t.Errorf("GPU-b health in latest snapshot = %v, want Healthy", h)
	}
}

func TestMonitorNeverBlocksOnASlowSubscriber(t *testing.T) {
	tr, err := health.NewTracker(cyclingPolicy(), []health.Device{{UUID: "GPU-a"}})
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	slow := m.Subscribe() // never read
	defer slow.Close()
	at := time.Unix(0, 0)
	// Each pair of signals is two transitions; far more than a subscriber keeps.
	n := health.MaxPendingTransitions
	for i := range n {
		m.Signal(health.XIDSignal("GPU-a", 48, at.Add(time.Duration(2*i)*time.Second)))
		m.Signal(health.Signal{Kind: health.SignalReset, Device: "GPU-a", Time: at.Add(time.Duration(2*i+1) * time.Second)})
	}
	u, ok := slow.Next()
	if !ok {
		t.Fatal("no update")
	}
	if len(u.Transitions) != health.MaxPendingTransitions || u.Dropped != 2*n-health.MaxPendingTransitions {
		t.Errorf("kept %d transitions, dropped %d; want %d kept and %d dropped",
			len(u.Transitions), u.Dropped, health.MaxPendingTransitions, 2*n-health.MaxPendingTransitions)
	}
	if last := u.Transitions[len(u.Transitions)-1]; last.To != health.Healthy {
		t.Errorf("last kept transition = %+v, want the newest (to Healthy)", last)
	}
}

func TestMonitorIsSafeForConcurrentUse(t *testing.T) {
	tr, err := health.NewTracker(cyclingPolicy(), []health.Device{{UUID: "GPU-a"}, {UUID: "GPU-b", Index: 1}})
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	sub := m.Subscribe()
	var wg sync.WaitGroup
	for _, uuid := range []string{"GPU-a", "GPU-b"} {
		wg.Go(func() {
			at := time.Unix(0, 0)
			for i := range 1000 {
				m.Signal(health.XIDSignal(uuid, 48, at.Add(time.Duration(i)*time.Second)))
				m.Signal(health.Signal{Kind: health.SignalReset, Device: uuid, Time: at.Add(time.Duration(i)*time.Second + 1)})
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			sub.Next()
			_ = m.Snapshot()
		}
	})
	wg.Wait()
	sub.Close()
	for _, d := range m.Snapshot().Devices {
		if d.Health != health.Healthy {
			t.Errorf("%s ends %v, want Healthy", d.Device.UUID, d.Health)
		}
	}
}

func TestWaitTakesThePendingUpdateOrReturnsWhenCancelled(t *testing.T) {
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a"}})
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	sub := m.Subscribe()
	defer sub.Close()
	sub.Next() // the initial snapshot
	m.Signal(health.XIDSignal("GPU-a", 79, time.Unix(100, 0)))
	u, ok := sub.Wait(context.Background())
	if !ok || len(u.Transitions) != 1 {
		t.Fatalf("Wait = %+v, %v; want the XID's transition", u, ok)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := sub.Wait(ctx); ok {
		t.Error("Wait with nothing pending and a cancelled context reported an update")
	}
}

// cyclingPolicy is the default policy without escalation, for tests that fault and reset one
// GPU thousands of times to exercise the machinery, not the GPU's history.
func cyclingPolicy() *health.Policy {
	p := health.DefaultPolicy()
	p.Escalation.Enabled = false
	return p
}
