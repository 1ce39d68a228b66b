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
		if got := Step(c.initial, c.max, c.n); got != c.want {
			t.Errorf("Step(%v, %v, %d) = %v, want %v", c.initial, c.max, c.n, got, c.want)
		}
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
