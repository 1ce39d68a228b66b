package reporter

import (
	"math"
	"time"
)

// limiter is the adaptive in-flight limit: how many posts may be on the
// wire at once. Its inputs are the answers' round-trip times with the posts
// in flight when each came back (sample), and the answers that say the
// partner is failing (failure); its output is limit. It is not safe for
// concurrent use (run.mu guards it) and reads no clock: every input
// carries its time, so tests feed it numbers.
//
// Three rules, after Envoy's adaptive_concurrency (gradient on a minimum
// RTT), Netflix's concurrency-limits (Gradient2, Vegas) and Vector's ARC:
//
//   - Grow while the partner keeps up. RTTs are averaged over an interval
//     (at least minInterval, one recent RTT and minSamples answers). When
//     the interval's mean stays within tolerance × baseline + slack of the
//     baseline (the lowest interval mean of the last baselineWindow), and
//     the posts in flight reached the limit during the interval (a backlog
//     waits for room: an idle reporter learns nothing of the partner),
//     the limit grows by √limit: from 48 to 1 024 in about 50 intervals,
//     7.5 s toward a partner 150 ms away.
//   - Shrink when latency rises: a mean over the threshold multiplies the
//     limit by threshold/mean (at least ½ per interval), never below the
//     starting limit (Config.Concurrency): queueing at the partner, or in
//     our own process, shows as latency before errors, and the reporter
//     gives the room back before the partner fails. The operator's
//     --concurrency is known to be safe, so latency alone does not go below.
//   - Halve on failure (AIMD's decrease, as before): a 500, 503, 429,
//     timeout or connection error halves the limit, once per cutInterval
//     (one burst is one signal), down to 1. Growth after a cut follows the
//     first rule.
//
// The baseline forgets after baselineWindow: a partner whose latency moved
// for good (a new route) becomes the new normal within a minute, at the
// cost of a slow sawtooth against a partner whose latency rises with our
// load for longer than that.
type limiter struct {
	limit float64
	start float64 // Config.Concurrency: the floor of latency cuts
	max   float64 // Config.MaxConcurrency

	// The interval being measured.
	from  time.Time
	sum   time.Duration
	n     int
	peak  int // most posts in flight seen at a sample
	means []rttMean

	baseline time.Duration // lowest interval mean within baselineWindow
	recent   time.Duration // the last interval's mean
	lastCut  time.Time     // last failure cut

	// Why the limit last moved, and how often it moved for each reason
	// (metrics).
	reason string
	moves  map[string]int64
}

// rttMean is one interval's mean RTT and when the interval closed.
type rttMean struct {
	at   time.Time
	mean time.Duration
}

// The controller's constants (see limiter).
const (
	minInterval    = 100 * time.Millisecond
	minSamples     = 16
	baselineWindow = time.Minute
	tolerance      = 1.5
	rttSlack       = time.Millisecond // scheduling noise on loopback
	cutInterval    = 100 * time.Millisecond
)

// Reasons the limit moved.
const (
	moveGrow    = "grow"
	moveLatency = "latency"
	moveFailure = "failure"
)

func newLimiter(start, maxLimit int, now time.Time) *limiter {
	return &limiter{limit: float64(start), start: float64(start), max: float64(maxLimit), from: now, moves: map[string]int64{}}
}

// allows reports whether one more post may start with inflight posts out.
func (l *limiter) allows(inflight int) bool { return float64(inflight) < math.Floor(l.limit) }

// room is how many more posts may start with inflight posts out.
func (l *limiter) room(inflight int) int { return max(0, int(l.limit)-inflight) }

// sample records the round trip of one answer from a partner that answered
// (not a failure), with inflight posts out when it came back.
func (l *limiter) sample(now time.Time, rtt time.Duration, inflight int) {
	l.sum += rtt
	l.n++
	l.peak = max(l.peak, inflight)
	if l.n < minSamples || now.Sub(l.from) < max(minInterval, l.recent) {
		return
	}
	mean := l.sum / time.Duration(l.n)
	saturated := float64(l.peak+1) >= math.Floor(l.limit)*0.9
	l.from, l.sum, l.n, l.peak = now, 0, 0, 0
	l.recent = mean
	// The baseline: the lowest mean of the window, this one included.
	keep := l.means[:0]
	for _, m := range l.means {
		if now.Sub(m.at) < baselineWindow {
			keep = append(keep, m)
		}
	}
	l.means = append(keep, rttMean{at: now, mean: mean})
	l.baseline = mean
	for _, m := range l.means {
		l.baseline = min(l.baseline, m.mean)
	}
	threshold := time.Duration(float64(l.baseline)*tolerance) + rttSlack
	switch {
	case mean > threshold:
		floor := math.Min(l.start, l.limit)
		next := math.Max(floor, l.limit*math.Max(0.5, float64(threshold)/float64(mean)))
		l.move(next, moveLatency)
	case saturated && l.limit < l.max:
		l.move(math.Min(l.max, l.limit+math.Max(1, math.Sqrt(l.limit))), moveGrow)
	}
}

// failure records an answer (or its absence) that says the partner is
// failing.
func (l *limiter) failure(now time.Time) {
	if now.Sub(l.lastCut) < cutInterval {
		return
	}
	l.lastCut = now
	l.move(math.Max(1, l.limit/2), moveFailure)
	// The interval under way mixed the partner's states: start anew.
	l.from, l.sum, l.n, l.peak = now, 0, 0, 0
}

func (l *limiter) move(next float64, why string) {
	if math.Floor(next) == math.Floor(l.limit) {
		l.limit = next
		return
	}
	l.limit = next
	l.reason = why
	l.moves[why]++
}
