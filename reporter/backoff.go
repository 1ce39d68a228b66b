package reporter

import "github.com/playpipe/playpipe/internal/backoff"

// retryPolicy is the reporter's retry delay: exponential from
// BackoffInitial, doubling per consecutive failure up to BackoffMax, with
// "equal jitter" (a uniform delay between half and all of the exponential
// step), and never shorter than the server's Retry-After (itself capped at
// RetryAfterMax).
func retryPolicy(cfg Config) backoff.Policy {
	return backoff.Policy{Initial: cfg.BackoffInitial, Max: cfg.BackoffMax, Jitter: backoff.Equal, RetryAfterMax: cfg.RetryAfterMax}
}
