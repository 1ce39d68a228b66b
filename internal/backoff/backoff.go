// Package backoff holds the retry arithmetic shared by playpipe's roles: the
// exponential step between attempts and a context-aware sleep. Each caller
// keeps its own jitter policy (full, equal or proportional), which depends on
// what it retries.
package backoff

import (
	"context"
	"time"
)

// Step returns the n-th exponential step (n ≥ 1): initial doubled n−1 times,
// never more than max. It does not overflow, whatever n.
func Step(initial, max time.Duration, n int) time.Duration {
	if initial <= 0 {
		return 0
	}
	d := initial
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// Sleep waits d, or until ctx ends; it reports whether the whole wait
// elapsed. A wait of d ≤ 0 reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
