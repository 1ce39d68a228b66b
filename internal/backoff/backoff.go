// Package backoff is the one retry policy of playpipe's retry loops: an
// exponential step between attempts, a jitter kind, an optional floor set by
// the server (Retry-After), and a context-aware sleep. The partner API client,
// the mix cache, the reporter and the ClickHouse sink each hold a Policy; they
// differ only in its fields. A Policy is a value: safe for concurrent use.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter says how a Policy randomises the exponential step d.
type Jitter int

// The jitter kinds.
const (
	// NoJitter waits exactly d.
	NoJitter Jitter = iota
	// Full waits a uniform time in [0, d): callers that retry together
	// spread out the most (AWS's "full jitter").
	Full
	// Equal waits a uniform time in [d/2, d]: at least half the step
	// (AWS's "equal jitter").
	Equal
	// Proportional waits a uniform time in [0.75·d, 1.25·d): ±25 %.
	Proportional
)

// Policy is an exponential backoff: the n-th wait (n ≥ 1) is Initial doubled
// n−1 times, capped at Max, randomised by Jitter, and never shorter than the
// server's Retry-After (capped at RetryAfterMax when that is set).
type Policy struct {
	// Initial is the first step; 0 makes every step 0.
	Initial time.Duration
	// Max caps the step (before jitter).
	Max time.Duration
	// Jitter randomises the step; the zero value is NoJitter.
	Jitter Jitter
	// RetryAfterMax caps the Retry-After that Delay honours; 0: uncapped.
	RetryAfterMax time.Duration
}

// Step returns the n-th exponential step (n ≥ 1; n < 1 reads as 1) without
// jitter: Initial doubled n−1 times, never more than Max. It does not
// overflow, whatever n.
func (p Policy) Step(n int) time.Duration {
	if p.Initial <= 0 {
		return 0
	}
	d := p.Initial
	for i := 1; i < n && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max)
}

// Delay returns the wait before the next attempt after the n-th consecutive
// failure (n ≥ 1): the jittered Step(n), or retryAfter (capped at
// RetryAfterMax when set) when that is longer.
func (p Policy) Delay(n int, retryAfter time.Duration) time.Duration {
	d := p.Jitter.apply(p.Step(n))
	if retryAfter > 0 {
		if p.RetryAfterMax > 0 {
			retryAfter = min(retryAfter, p.RetryAfterMax)
		}
		d = max(d, retryAfter)
	}
	return d
}

func (j Jitter) apply(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	switch j {
	case Full:
		return rand.N(d)
	case Equal:
		half := d / 2
		return half + rand.N(d-half+1)
	case Proportional:
		return time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
	}
	return d
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
