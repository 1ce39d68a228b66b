package reporter

import (
	"math/rand/v2"
	"time"

	"github.com/playpipe/playpipe/internal/backoff"
)

// retryPolicy computes retry delays: exponential from Initial, doubling per
// consecutive failure up to Max, with "equal jitter" (a uniform delay between
// half and all of the exponential step), and never shorter than the server's
// Retry-After (itself capped at RetryAfterMax).
type retryPolicy struct {
	Initial       time.Duration
	Max           time.Duration
	RetryAfterMax time.Duration
}

// delay returns the wait before the next post after the n-th consecutive
// failure (n ≥ 1).
func (b retryPolicy) delay(n int, retryAfter time.Duration) time.Duration {
	if n < 1 {
		n = 1
	}
	d := backoff.Step(b.Initial, b.Max, n)
	if d > 1 {
		half := d / 2
		d = half + time.Duration(rand.Int64N(int64(d-half)+1))
	}
	if retryAfter > 0 {
		d = max(d, min(retryAfter, b.RetryAfterMax))
	}
	return d
}
