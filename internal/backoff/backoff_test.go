package backoff

import (
	"context"
	"testing"
	"time"
)

func TestStep(t *testing.T) {
	for _, c := range []struct {
		initial, max time.Duration
		n            int
		want         time.Duration
	}{
		{100 * time.Millisecond, 10 * time.Second, 0, 100 * time.Millisecond},
		{100 * time.Millisecond, 10 * time.Second, 1, 100 * time.Millisecond},
		{100 * time.Millisecond, 10 * time.Second, 4, 800 * time.Millisecond},
		{100 * time.Millisecond, 10 * time.Second, 8, 10 * time.Second},
		{100 * time.Millisecond, 10 * time.Second, 1 << 30, 10 * time.Second},
		{time.Second, 500 * time.Millisecond, 1, 500 * time.Millisecond},
		{0, time.Second, 5, 0},
	} {
		if got := (Policy{Initial: c.initial, Max: c.max}).Step(c.n); got != c.want {
			t.Errorf("Step(%v, %v, %d) = %v, want %v", c.initial, c.max, c.n, got, c.want)
		}
	}
}

func TestDelayJitter(t *testing.T) {
	const step = 800 * time.Millisecond
	for _, c := range []struct {
		j      Jitter
		lo, hi time.Duration // lo ≤ d ≤ hi
	}{
		{NoJitter, step, step},
		{Full, 0, step - 1},
		{Equal, step / 2, step},
		{Proportional, step * 3 / 4, step * 5 / 4},
	} {
		p := Policy{Initial: 100 * time.Millisecond, Max: 10 * time.Second, Jitter: c.j}
		for range 200 {
			if d := p.Delay(4, 0); d < c.lo || d > c.hi {
				t.Fatalf("jitter %d: Delay(4) = %v, want in [%v, %v]", c.j, d, c.lo, c.hi)
			}
		}
	}
}

func TestDelayRetryAfter(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: Equal}
	if d := p.Delay(1, time.Hour); d != time.Hour {
		t.Errorf("uncapped Retry-After: Delay = %v, want 1h", d)
	}
	p.RetryAfterMax = 5 * time.Second
	if d := p.Delay(1, 3*time.Second); d != 3*time.Second {
		t.Errorf("Delay = %v, want the Retry-After 3s", d)
	}
	if d := p.Delay(1, time.Hour); d != 5*time.Second {
		t.Errorf("Delay = %v, want Retry-After capped at 5s", d)
	}
	if d := p.Delay(10, time.Millisecond); d < 500*time.Millisecond {
		t.Errorf("Delay = %v: a short Retry-After must not shorten the step", d)
	}
}

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("an uncancelled sleep reported cancellation")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) || Sleep(ctx, 0) {
		t.Error("a cancelled sleep reported the whole wait")
	}
	if !Sleep(context.Background(), 0) {
		t.Error("a zero wait on a live context reported cancellation")
	}
}
