package simdriver_test

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// fastClock is the real clock run faster: an hour of scenario in a minute at speed 60. It stands
// still at its epoch until start, so that a consumer can open NVML, register its events and take
// its first sampling round at the scenario's 0s. Timers fire on the real clock, scaled.
type fastClock struct {
	speed   float64
	epoch   time.Time
	started chan struct{}

	once      sync.Once
	realStart time.Time // set once, before started is closed
}

var _ clock.WithTicker = (*fastClock)(nil)

func newFastClock(speed float64, epoch time.Time) *fastClock {
	return &fastClock{speed: speed, epoch: epoch, started: make(chan struct{})}
}

// start lets time run.
func (c *fastClock) start() {
	c.once.Do(func() {
		c.realStart = time.Now()
		close(c.started)
	})
}

func (c *fastClock) Now() time.Time {
	select {
	case <-c.started:
		return c.epoch.Add(time.Duration(float64(time.Since(c.realStart)) * c.speed))
	default:
		return c.epoch
	}
}

func (c *fastClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// real is how long d of this clock's time takes on the real clock.
func (c *fastClock) real(d time.Duration) time.Duration { return time.Duration(float64(d) / c.speed) }

func (c *fastClock) NewTimer(d time.Duration) clock.Timer {
	t := &fastTimer{clk: c, ch: make(chan time.Time, 1)}
	t.arm(d)
	return t
}

func (c *fastClock) After(d time.Duration) <-chan time.Time { return c.NewTimer(d).C() }

func (c *fastClock) Sleep(d time.Duration) { <-c.After(d) }

func (c *fastClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.NewTimer(d)
	go func() {
		if _, ok := <-t.C(); ok {
			f()
		}
	}()
	return t
}

func (c *fastClock) NewTicker(d time.Duration) clock.Ticker {
	tk := &fastTicker{ch: make(chan time.Time, 1), stop: make(chan struct{})}
	go func() {
		next := c.Now().Add(d)
		for {
			timer := c.NewTimer(next.Sub(c.Now()))
			select {
			case <-tk.stop:
				timer.Stop()
				return
			case now := <-timer.C():
				select {
				case tk.ch <- now:
				default: // a slow reader misses ticks, as with time.Ticker
				}
				next = next.Add(d)
			}
		}
	}()
	return tk
}

func (c *fastClock) Tick(d time.Duration) <-chan time.Time { return c.NewTicker(d).C() }

// fastTimer fires once its clock reaches the time it was armed for.
type fastTimer struct {
	clk *fastClock
	ch  chan time.Time

	mu     sync.Mutex
	cancel chan struct{} // closed by Stop; nil once fired or stopped
}

func (t *fastTimer) arm(d time.Duration) {
	cancel := make(chan struct{})
	t.mu.Lock()
	t.cancel = cancel
	t.mu.Unlock()
	at := t.clk.Now().Add(d)
	go func() {
		select {
		case <-t.clk.started:
		case <-cancel:
			return
		}
		if wait := t.clk.real(at.Sub(t.clk.Now())); wait > 0 {
			rt := time.NewTimer(wait)
			select {
			case <-rt.C:
			case <-cancel:
				rt.Stop()
				return
			}
		}
		t.mu.Lock()
		if t.cancel != cancel { // stopped (and maybe re-armed) meanwhile
			t.mu.Unlock()
			return
		}
		t.cancel = nil
		t.mu.Unlock()
		select {
		case t.ch <- t.clk.Now():
		default:
		}
	}()
}

func (t *fastTimer) C() <-chan time.Time { return t.ch }

func (t *fastTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cancel == nil {
		return false
	}
	close(t.cancel)
	t.cancel = nil
	return true
}

func (t *fastTimer) Reset(d time.Duration) bool {
	active := t.Stop()
	t.arm(d)
	return active
}

type fastTicker struct {
	ch       chan time.Time
	stop     chan struct{}
	stopOnce sync.Once
}

func (t *fastTicker) C() <-chan time.Time { return t.ch }

func (t *fastTicker) Stop() { t.stopOnce.Do(func() { close(t.stop) }) }
