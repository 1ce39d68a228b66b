package reporter

import (
	"math"
	"time"

	"github.com/playpipe/playpipe/reporter/delivery"
)

// waitRate waits, on the clock, for the rate limit's (--rate) next token
// and returns how long it waited; an error when the posts' context ended
// first (the token is given back).
func (rn *run) waitRate() (time.Duration, error) {
	now := rn.cfg.Now()
	res := rn.limiter.ReserveN(now, 1) // Burst ≥ 1: always OK
	d := res.DelayFrom(now)
	if d <= 0 {
		return 0, nil
	}
	t := rn.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return d, nil
	case <-rn.postCtx.Done():
		res.CancelAt(rn.cfg.Now())
		return rn.cfg.Now().Sub(now), rn.postCtx.Err()
	}
}

// throttle makes the reporter back off as a whole toward a failing partner,
// not only report by report: without it, every report backs off on its own
// while new ones keep being posted, and a partner that sheds load sees
// thousands of posts a second for as long as it is down.
//
// Two mechanisms, both guarded by run.mu:
//
//   - The adaptive in-flight limit (limit.go): the posts in flight are
//     capped by a limit between 1 and MaxConcurrency that grows while the
//     partner's latency stays flat, shrinks when it rises or when the
//     error rate rises with the load, and halves on back-pressure
//     (429, 503, timeouts: AIMD's decrease) — a timeout or error only when
//     it is the partner's, not one payload's while the others are answered
//     (limiter.judge).
//   - A retry budget (a token bucket of failures): each failed post takes a
//     token; tokens come back at BudgetFloor per second plus BudgetRatio per
//     successful post, up to a burst of Concurrency. With no token left,
//     nothing is posted until one comes back. In a full outage the partner
//     therefore sees about BudgetFloor posts a second (probes); as soon as
//     posts succeed again the successes refill the budget and the limit
//     grows back.
//
// 401s (session renewal) are not partner health signals; a 400 counts
// toward the limit's error rate only (Decision.Signal).
type throttle struct {
	lim *limiter

	max        float64 // Concurrency: the budget's burst
	tokens     float64
	refilledAt time.Time
	floor      float64 // tokens per second
	ratio      float64 // tokens per success
	now        func() time.Time

	shed int64 // times posting was held for want of a token
}

func newThrottle(cfg Config, now time.Time) *throttle {
	return &throttle{
		lim: newLimiter(cfg.Concurrency, cfg.MaxConcurrency, now),
		max: float64(cfg.Concurrency), tokens: float64(cfg.Concurrency), refilledAt: now,
		floor: cfg.BudgetFloor, ratio: cfg.BudgetRatio, now: cfg.Now,
	}
}

// refill adds the tokens the floor rate earned since the last refill.
func (t *throttle) refill(now time.Time) {
	if el := now.Sub(t.refilledAt).Seconds(); el > 0 {
		t.tokens = math.Min(t.max, t.tokens+el*t.floor)
		t.refilledAt = now
	}
}

// allows reports whether one more post may start with inflight posts out.
// The clock is read only when the budget is short: refill is linear and
// capped, so refilling late adds what refilling at every post would have.
func (t *throttle) allows(inflight int) bool {
	if !t.lim.allows(inflight) {
		return false
	}
	if t.tokens >= 1 {
		return true
	}
	t.refill(t.now())
	if t.tokens < 1 {
		t.shed++
		return false
	}
	return true
}

// success records an answer from a healthy partner (sig: what it tells
// the in-flight limit) to the post numbered n (limiter.started) that took
// rtt, with inflight posts out when it came back.
func (t *throttle) success(now time.Time, sig delivery.Signal, n uint64, rtt time.Duration, inflight int) {
	t.tokens = math.Min(t.max, t.tokens+t.ratio)
	if sig == delivery.SignalAnswer {
		t.lim.answered(n)
	}
	t.lim.observe(now, sig, rtt, inflight)
}

// failure records a failed post numbered n (retry: its report failed
// before): an answer (or its absence) to be retried. It takes a token; sig,
// as the limiter judges it (limiter.judge), says whether it moves the
// limit.
func (t *throttle) failure(now time.Time, sig delivery.Signal, n uint64, retry bool, rtt time.Duration, inflight int) delivery.Signal {
	t.refill(now)
	t.tokens = math.Max(t.tokens-1, -t.max) // a burst in flight may overdraw a little
	judged := t.lim.judge(sig, n, retry, rtt)
	t.lim.observe(now, judged, rtt, inflight)
	return judged
}

// readyAt is when the next token will be there (zero when one is).
func (t *throttle) readyAt(now time.Time) time.Time {
	t.refill(now)
	if t.tokens >= 1 || t.floor <= 0 {
		return time.Time{}
	}
	// Rounded up: at the instant returned, the refill has the whole token.
	return now.Add(time.Duration(math.Ceil((1 - t.tokens) / t.floor * float64(time.Second))))
}
