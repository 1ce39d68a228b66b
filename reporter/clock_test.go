package reporter

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/partnerapi"
)

// fakeClock is a Clock that moves only when a test advances it: its
// timers fire in Advance, never on their own.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]struct{} // pending
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Unix(1_700_000_000, 0), timers: map[*fakeTimer]struct{}{}}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// Advance moves the clock by d and fires the timers due by then.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for t := range c.timers {
		if !t.at.After(c.now) {
			delete(c.timers, t)
			t.fire(c.now)
		}
	}
}

// WaitFor returns once the clock has moved d from now (another goroutine
// advances it), polling the real clock: how a test waits for a span of the
// reporter's time.
func (c *fakeClock) WaitFor(d time.Duration) {
	until := c.Now().Add(d)
	for c.Now().Before(until) {
		time.Sleep(time.Millisecond) // polls the goroutine that advances the clock
	}
}

// Drive advances the clock by step every real millisecond until the
// returned stop is called (after the reporter stopped: its shutdown waits
// on the clock's timers too). The reporter's time then runs step/1ms times
// faster than the real one, while its posts, Kafka and the partner keep
// their real pace.
func (c *fakeClock) Drive(step time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				c.Advance(step)
			case <-done:
				return
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

type fakeTimer struct {
	c  *fakeClock
	ch chan time.Time
	at time.Time // guarded by c.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

// fire delivers now (c.mu held); the channel holds one value, as a real
// timer's does.
func (t *fakeTimer) fire(now time.Time) {
	select {
	case t.ch <- now:
	default:
	}
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, pending := t.c.timers[t]
	t.drain()
	t.at = t.c.now.Add(d)
	if d <= 0 {
		delete(t.c.timers, t)
		t.fire(t.c.now)
	} else {
		t.c.timers[t] = struct{}{}
	}
	return pending
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, pending := t.c.timers[t]
	delete(t.c.timers, t)
	t.drain()
	return pending
}

// drain drops a value fired and not received (Go 1.23 timers deliver no
// stale value after Reset or Stop).
func (t *fakeTimer) drain() {
	select {
	case <-t.ch:
	default:
	}
}

// TestFakeClock: timers fire when the clock is advanced past them, once,
// and not after Stop or before their time.
func TestFakeClock(t *testing.T) {
	c := newFakeClock()
	a, b := c.NewTimer(100*time.Millisecond), c.NewTimer(time.Second)
	c.Advance(99 * time.Millisecond)
	select {
	case <-a.C():
		t.Fatal("fired 1 ms early")
	default:
	}
	c.Advance(time.Millisecond)
	select {
	case at := <-a.C():
		if want := time.Unix(1_700_000_000, 0).Add(100 * time.Millisecond); !at.Equal(want) {
			t.Fatalf("fired with %v, want %v", at, want)
		}
	default:
		t.Fatal("did not fire at its time")
	}
	if !b.Stop() || b.Stop() {
		t.Fatal("Stop must report the pending timer once")
	}
	c.Advance(time.Hour)
	select {
	case <-b.C():
		t.Fatal("a stopped timer fired")
	case <-a.C():
		t.Fatal("a fired timer fired again")
	default:
	}
	a.Reset(10 * time.Millisecond)
	c.Advance(10 * time.Millisecond)
	if _, ok := <-a.C(); !ok {
		t.Fatal("reset timer did not fire")
	}
}

// TestRateWaitsOnTheClock: with --rate, a post beyond the burst waits for
// its token on the injected clock: nothing happens until the test advances
// it by the token's interval.
func TestRateWaitsOnTheClock(t *testing.T) {
	rn, _ := bareRun(t, 1, 0)
	clk := newFakeClock()
	rn.cfg.Clock, rn.cfg.Now = clk, clk.Now
	rn.limiter = rate.NewLimiter(10, 1) // --rate 10 --rate-burst 1: a token every 100 ms
	if w, err := rn.waitRate(); w != 0 || err != nil {
		t.Fatalf("first post waited %v (%v): the burst allows it", w, err)
	}
	got := make(chan time.Duration, 1)
	go func() {
		w, _ := rn.waitRate()
		got <- w
	}()
	for clk.pending() == 0 {
		time.Sleep(time.Millisecond) // the goroutine reaches its timer
	}
	select {
	case w := <-got:
		t.Fatalf("the second post went after %v without the clock moving", w)
	default:
	}
	clk.Advance(100 * time.Millisecond)
	select {
	case w := <-got:
		if w != 100*time.Millisecond {
			t.Fatalf("waited %v, want 100ms", w)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the clock moved past the token's time and the post still waits")
	}
}

// pending is the number of timers not fired or stopped.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// probeAPI answers the standby probe's sessions from standby until live is
// set, and counts them.
type probeAPI struct {
	ctxAPI
	sessions atomic.Int64
	live     atomic.Bool
}

func (a *probeAPI) Session(context.Context) (partnerapi.Meta, error) {
	a.sessions.Add(1)
	if a.live.Load() {
		return partnerapi.Meta{Status: 200}, nil
	}
	return partnerapi.Meta{Status: 200, ServedBy: partnerapi.ServedStandby}, nil
}

// TestProbeWaitsOnTheClock: a standby episode's prober asks for a session
// once per ProbeInterval of the injected clock: none before the interval
// has passed, one per interval while standby answers, and the episode ends
// at the first live one.
func TestProbeWaitsOnTheClock(t *testing.T) {
	rn, _ := bareRun(t, 2, 1)
	clk := newFakeClock()
	rn.cfg.Clock, rn.cfg.Now = clk, clk.Now
	api := &probeAPI{}
	rn.api, rn.log = api, testLogger(t)
	interval := rn.cfg.ProbeInterval
	rn.mu.Lock()
	rn.startEpisode(rn.fresh.pop())
	rn.mu.Unlock()
	t.Cleanup(func() { rn.cancelPosts(); rn.bg.Wait() })
	waitProbe := func(sessions int64) {
		t.Helper()
		// The prober's session is taken and its next timer set: polls
		// another goroutine, no timer involved.
		waitFor(t, 5*time.Second, func() bool { return api.sessions.Load() == sessions && clk.pending() == 1 })
	}
	waitProbe(0)
	clk.Advance(interval - time.Millisecond)
	if n := api.sessions.Load(); n != 0 || clk.pending() != 1 {
		t.Fatalf("%d sessions before the probe interval passed", n)
	}
	clk.Advance(time.Millisecond)
	waitProbe(1) // standby again: the prober waits another interval
	api.live.Store(true)
	clk.Advance(interval)
	waitFor(t, 5*time.Second, func() bool {
		rn.mu.Lock()
		defer rn.mu.Unlock()
		return rn.standby == nil
	})
	if n := api.sessions.Load(); n != 2 {
		t.Fatalf("%d sessions for two probe intervals, want 2", n)
	}
}
