package reporter

import (
	"math/rand/v2"
	"time"
)

// backoff computes retry delays: exponential from Initial, doubling per
// consecutive failure up to Max, with "equal jitter" (a uniform delay between
// half and all of the exponential step), and never shorter than the server's
// Retry-After (itself capped at RetryAfterMax).
type backoff struct {
	Initial       time.Duration
	Max           time.Duration
	RetryAfterMax time.Duration
}

// delay returns the wait before the next post after the n-th consecutive
// failure (n ≥ 1).
func (b backoff) delay(n int, retryAfter time.Duration) time.Duration {
	if n < 1 {
		n = 1
	}
	d := b.Initial
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if d > 1 {
		half := d / 2
		d = half + time.Duration(rand.Int64N(int64(d-half)+1))
	}
	if retryAfter > 0 {
		d = max(d, min(retryAfter, b.RetryAfterMax))
	}
	return d
}
