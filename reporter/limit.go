package reporter

import (
	"math"
	"time"

	"github.com/playpipe/playpipe/reporter/delivery"
)

// limiter is the adaptive in-flight limit: how many posts may be on the
// wire at once. Its one input is observe: each answer's Signal, round trip
// and the posts in flight when it came back; its output is limit. It is
// not safe for concurrent use (run.mu guards it) and reads no clock: every
// input carries its time, so tests feed it numbers.
//
// It shrinks on back-pressure, not on bad luck, after Vector's ARC
// (back-pressure answers cut, other errors do not), Netflix's
// concurrency-limits (Gradient2, Vegas: latency; errors it is told to
// ignore) and Envoy's adaptive_concurrency (a gradient on a minimum RTT).
//
// At once, between intervals:
//
//   - Back-pressure halves (SignalBackPressure, SignalTimeout: 429, 503,
//     408, Retry-After, a timeout): the partner asks for less, or no longer
//     answers in time. Once per cut gap (max(cutInterval, the recent RTT):
//     the answers of one window of posts are one signal), down to 1 —
//     below the starting limit: a real outage makes the reporter back off
//     as a whole. The interval under way starts anew.
//
// Every other answer joins an interval (at least minInterval, one recent
// RTT and minSamples answers); at its close the first rule that holds
// applies:
//
//   - The error rate rose with our load: payload errors, edge pages and
//     lost connections (SignalPayload, SignalEdge, SignalConnection) are
//     never acted on one by one. They are counted by load, the most posts
//     in flight (errRates, buckets √2 apart, decayed over errWindow), and
//     the interval's count is compared with what the rate seen at about
//     half the load or less (two buckets down) predicts (λ):
//     over max(errRatio·λ, λ + errSigmas·noise) + errSlack — noise the
//     count's own √λ widened by the reference's own size — the errors
//     follow the limit, and the limit is multiplied by rateCut, never below
//     the starting limit (Config.Concurrency). A steady rate, however high,
//     is the same at every limit and never cuts. A rate that rose on its
//     own (not with load) cuts until the limit is where no lower rate is
//     known (--concurrency): the rates are forgotten there and measured
//     anew on the climb back.
//   - Latency rose: a mean RTT over tolerance × baseline + slack (the
//     baseline: the lowest interval mean of the last baselineWindow)
//     multiplies the limit by threshold/mean (at least ½ per interval),
//     never below the starting limit: queueing at the partner, or in our
//     own process, shows as latency before errors.
//   - Grow while the partner keeps up: the mean within the threshold and
//     the posts in flight reached the limit during the interval (a backlog
//     waits for room: an idle reporter learns nothing of the partner): the
//     limit grows by √limit, from 48 to 1 024 in about 50 intervals —
//     after a slow start (TCP's, after HyStart's delay signal): from the
//     process's start the limit doubles per interval instead — by √2,
//     one bucket of the error rate, once an interval counted an error or
//     had a mean over slowStartTolerance × baseline + slack (the latency
//     began to rise, under the threshold: on a busy machine our own
//     process shows it too) — until the error rate rises (which ends it
//     without a cut) or the limit moves for any other reason (a latency
//     or back-pressure cut). From 48 to 1 024 in 5 intervals
//     toward a partner that keeps up (half a second at 50 ms, against
//     five), so that a backlog at the start is not worked at a fraction
//     of what the partner takes for seconds. A slow start never comes
//     back: after an outage the limit climbs by √limit.
//
// Before any of these, a failed post is judged (judge): a timeout or an
// error is the partner's — load or outage — only when no post started after
// it was answered normally, or the answered posts' latency is over the
// threshold and not a fraction of the failed post's own. Otherwise the partner answers the others at their usual
// latency while this post failed: its payload's problem. Such a failure of
// a report that already failed moves nothing (signalIsolated); a first
// failure counts toward the error rate (a timeout as an error, not
// back-pressure), so that many payloads failing at once still cut by the
// rate rule. A partner that hangs on one track therefore never collapses
// the limit, while one that stops answering (no post started later is
// answered) or slows down (latency) still cuts it.
//
// The RTT baseline forgets after baselineWindow: a partner whose latency
// moved for good (a new route) becomes the new normal within a minute, at
// the cost of a slow sawtooth against a partner whose latency rises with
// our load for longer than that.
type limiter struct {
	limit float64
	start float64 // Config.Concurrency: the floor of latency and rate cuts
	max   float64 // Config.MaxConcurrency

	// The interval being measured: every answer counts in n, the round
	// trips of the normal ones in sum and ok, the errors that make the
	// rate in errs.
	from  time.Time
	n     int
	ok    int
	sum   time.Duration
	errs  int
	peak  int // most posts in flight seen at an answer
	means []rttMean

	baseline time.Duration // lowest interval mean within baselineWindow
	// slowStart: the limit still doubles per interval of growth (see
	// limiter); false from the first interval whose latency rose or that
	// counted an error, or the first cut, on.
	slowStart bool
	// gentle: the slow start grows by slowStartGentle per interval, not
	// slowStartGrowth: an interval counted an error of the rate rule, or
	// its mean rose over slowStartTolerance × baseline + rttSlack.
	gentle  bool
	recent  time.Duration // the last interval's mean
	lastCut time.Time     // last back-pressure cut

	// posts numbers the posts started (started); answeredUpTo is the
	// largest number of a post answered normally (answered): a failed post
	// with a smaller number than it saw a later post answered (judge).
	posts        uint64
	answeredUpTo uint64
	// out are the posts in flight by number (out[0] is post outBase), in
	// start order, done ones kept until those before them are done too;
	// the first stallIdx of them were passed by advance, stalled of those
	// are still out: stalled posts (see stalledOut).
	out      []outPost
	outBase  uint64
	stallIdx int
	stalled  int
	// stalledRetries are the stalled posts of reports that failed before;
	// stalledSuspects those of fresh reports of suspect tracks.
	stalledRetries  int
	stalledSuspects int
	// sus is the tracks whose posts stalled (suspect.go).
	sus suspects

	// The error rate by load (errBucket): errors and answers at each, both
	// decayed by e^(-t/errWindow) when the load comes back to it.
	errRates [errBuckets]errRate

	// Why the limit last moved, and how often it moved for each reason
	// (metrics).
	reason string
	moves  map[string]int64
}

// outPost is one post started: when (Unix nanoseconds), and whether it is
// back.
type outPost struct {
	at      int64
	track   int64 // its report's trackid (trackKey; 0: none)
	done    bool
	retry   bool // its report failed before
	suspect bool // a fresh report of a suspect track (suspect.go)
}

// rttMean is one interval's mean RTT and when the interval closed.
type rttMean struct {
	at   time.Time
	mean time.Duration
}

// errRate is the errors and answers seen at one bucket of limits, as of at.
type errRate struct {
	errs, answers float64
	at            time.Time
}

// The controller's constants (see limiter).
const (
	minInterval    = 100 * time.Millisecond
	minSamples     = 16
	baselineWindow = time.Minute
	tolerance      = 1.5
	// slowStartTolerance: a mean over this × baseline + rttSlack slows
	// the slow start (the latency has begun to rise, under the threshold).
	slowStartTolerance = 1.125
	// slowStartGrowth: the slow start's factor per interval while every
	// answer is clean and the latency flat; then slowStartGentle: one
	// bucket of the error rate (errBucket, √2 apart), so that each load is
	// measured before the next and the rate rule keeps its references,
	// and a rising latency meets the threshold at most √2 past its knee.
	slowStartGrowth = 2.0
	slowStartGentle = math.Sqrt2
	rttSlack        = time.Millisecond // scheduling noise on loopback
	cutInterval     = 100 * time.Millisecond
	stallMin        = 250 * time.Millisecond // the least time out of a stalled post …
	stallRTTs       = 8                      // … and in baseline round trips
	isolatedRatio   = 4                      // answers this many times faster than a failed post: it failed alone
	backoffRatio    = 0.5                    // back-pressure's cut

	errMinAnswers = 500              // answers at lower loads to judge the rate by
	errWindow     = 30 * time.Second // a rate's decay when its load comes back
	errRatio      = 2.0              // a rate this many times the reference …
	errSigmas     = 4.0              // … and this many deviations over it …
	errSlack      = 3.0              // … plus this many errors is no noise
	rateCut       = 0.9              // the cut of a rate that rose
	errBuckets    = 32               // limits up to 2^16
)

// Reasons the limit moved.
const (
	moveGrow         = "grow"
	moveLatency      = "latency"
	moveBackPressure = "back_pressure"
	moveTimeout      = "timeout"
	moveErrorRate    = "error_rate"
)

func newLimiter(start, maxLimit int, now time.Time) *limiter {
	return &limiter{limit: float64(start), start: float64(start), max: float64(maxLimit), from: now, moves: map[string]int64{}, outBase: 1, slowStart: true}
}

// allows reports whether one more post may start with inflight posts out,
// the stalled ones not counted (stalledOut), and never more than
// MaxConcurrency in all (the workers, and the client's connections).
func (l *limiter) allows(inflight int) bool {
	return inflight < int(l.max) && float64(inflight-l.stalledOut()) < math.Floor(l.limit)
}

// room is how many more posts may start with inflight posts out, the
// stalled ones not counted, within MaxConcurrency in all.
func (l *limiter) room(inflight int) int {
	return max(0, min(int(l.max)-inflight, int(l.limit)-inflight+l.stalledOut()))
}

// Stalled posts. A post out longer than stallAfter while the partner
// answered posts started after it, at their usual latency, is hanging on
// its payload (a partner's gateway holding one track until our timeout):
// it no longer counts against the limit — the limit is what the partner
// takes at once, and it is taking the others. The posts in flight stay
// within MaxConcurrency in all (the workers, and the client's connections:
// a post waiting for a connection would look stalled), so stalled posts use
// the room between the limit and MaxConcurrency;
// one that slows down (answers over the latency threshold and over a
// quarter of stallAfter) or stops answering posts started later has none
// left out.

// stallAfter is how long a post must be out, at least, to be stalled:
// stallRTTs baseline round trips, at least stallMin.
func (l *limiter) stallAfter() time.Duration { return max(stallMin, stallRTTs*l.baseline) }

// stalledOut is how many posts in flight are left out of the limit.
func (l *limiter) stalledOut() int {
	if l.stalled == 0 || !l.answersFast(l.stallAfter()) {
		return 0
	}
	return min(l.stalled, int(l.max))
}

// stalledRetriesOut is how many of the stalled posts left out are retries
// that no longer hold one of the retries' slots either (retryCap): at most
// retryShare of the MaxConcurrency stalled posts, so that hanging retries
// spend their budget at more than retryCap per timeout while the fresh
// reports keep most of the stalled room.
func (l *limiter) stalledRetriesOut() int {
	if l.stalledOut() == 0 {
		return 0
	}
	return min(l.stalledRetries, l.stalledOut(), int(l.max*retryShare))
}

// stalledSuspectsOut is how many of the stalled posts left out are fresh
// reports of suspect tracks that no longer hold one of their slots either
// (suspectCap): at most suspectRoomShare of the room between the limit and
// MaxConcurrency, where stalled posts are.
func (l *limiter) stalledSuspectsOut() int {
	if l.stalledOut() == 0 {
		return 0
	}
	return min(l.stalledSuspects, l.stalledOut(), int((l.max-l.limit)*suspectRoomShare))
}

// advance passes the posts that stalled by now: out longer than
// stallAfter, and started before the last post answered normally.
func (l *limiter) advance(now time.Time) {
	cut := now.Add(-l.stallAfter()).UnixNano()
	fast := -1 // answersFast(stallAfter), looked at once
	for l.stallIdx < len(l.out) {
		p := l.out[l.stallIdx]
		if l.outBase+uint64(l.stallIdx) >= l.answeredUpTo || p.at > cut {
			return
		}
		if !p.done {
			l.stalled++
			if p.retry {
				l.stalledRetries++
			}
			if p.suspect {
				l.stalledSuspects++
			}
			if fast < 0 {
				fast = 0
				if l.answersFast(l.stallAfter()) {
					fast = 1
				}
			}
			if fast == 1 {
				l.sus.stalled(p.track, now) // hanging on its payload: its track is suspect
			}
		}
		l.stallIdx++
	}
}

// finished records that the post numbered n is back (answered, failed or
// abandoned).
func (l *limiter) finished(n uint64) {
	if n < l.outBase || n >= l.outBase+uint64(len(l.out)) {
		return
	}
	i := int(n - l.outBase)
	if l.out[i].done {
		return
	}
	l.out[i].done = true
	if i < l.stallIdx {
		l.stalled--
		if l.out[i].retry {
			l.stalledRetries--
		}
		if l.out[i].suspect {
			l.stalledSuspects--
		}
	}
	k := 0
	for k < len(l.out) && l.out[k].done {
		k++
	}
	if k > 0 {
		l.out = l.out[k:]
		l.outBase += uint64(k)
		l.stallIdx = max(0, l.stallIdx-k)
	}
}

// observe records one answer (or its absence: a timeout, a lost
// connection) that took rtt, with inflight posts out when it came back.
func (l *limiter) observe(now time.Time, sig delivery.Signal, rtt time.Duration, inflight int) {
	l.advance(now)
	l.sus.at = now
	inflight -= l.stalledOut() // the load the limit holds

	switch sig {
	case delivery.SignalBackPressure, delivery.SignalTimeout:
		l.backPressure(now, sig)
		return
	case delivery.SignalIsolated:
		return
	case delivery.SignalPayload, delivery.SignalEdge, delivery.SignalConnection:
		l.errs++
	default:
		l.sum += rtt
		l.ok++
	}
	l.n++
	l.peak = max(l.peak, inflight)
	if l.n < minSamples || now.Sub(l.from) < max(minInterval, l.recent) {
		return
	}
	l.close(now)
}

// started numbers a post that starts now (retry: of a report that failed
// before; suspect: a fresh report of a suspect track; track: its trackid,
// 0 for none): the number judge, answered and finished take.
func (l *limiter) started(now time.Time, retry, suspect bool, track int64) uint64 {
	l.posts++
	if len(l.out) == 0 {
		l.outBase = l.posts
	}
	l.out = append(l.out, outPost{at: now.UnixNano(), track: track, retry: retry, suspect: suspect})
	return l.posts
}

// answered records that the post numbered n was answered normally
// (SignalAnswer).
func (l *limiter) answered(n uint64) { l.answeredUpTo = max(l.answeredUpTo, n) }

// judge is what a failed post (numbered n, out for rtt; retry: its report
// failed before) tells the limit: sig itself when the failure may be the
// partner's — no post started after it was answered normally, or the
// answered posts are slow: over the latency threshold, and not a small
// share (isolatedRatio) of this post's time — and otherwise a payload's
// failure: signalIsolated for a retry, an error of the rate rule for a
// first failure. Back-pressure (429, 503, Retry-After) is the partner
// asking for less, whoever asked: always sig (run.limitSignal makes one
// payload's repeated 503s isolated before they get here).
func (l *limiter) judge(sig delivery.Signal, n uint64, retry bool, rtt time.Duration) delivery.Signal {
	switch sig {
	case delivery.SignalTimeout, delivery.SignalPayload, delivery.SignalEdge, delivery.SignalConnection:
	default:
		return sig
	}
	if l.answeredUpTo <= n || !l.answersFast(rtt) {
		return sig
	}
	if retry {
		return delivery.SignalIsolated
	}
	if sig == delivery.SignalTimeout {
		return delivery.SignalPayload
	}
	return sig
}

// answersFast reports whether the partner answers at its usual latency
// next to a post out for d: within the latency threshold, or in a small
// share (1/isolatedRatio) of d.
func (l *limiter) answersFast(d time.Duration) bool {
	return l.baseline == 0 || l.recent <= l.threshold() || time.Duration(isolatedRatio)*l.recent <= d
}

// threshold is the latency over which the partner is taken as slowing
// down: tolerance × baseline + slack.
func (l *limiter) threshold() time.Duration {
	return time.Duration(float64(l.baseline)*tolerance) + rttSlack
}

// backPressure halves the limit once per max(cutInterval, recent RTT),
// down to 1.
func (l *limiter) backPressure(now time.Time, sig delivery.Signal) {
	if now.Sub(l.lastCut) < max(cutInterval, l.recent) {
		return
	}
	l.lastCut = now
	why := moveBackPressure
	if sig == delivery.SignalTimeout {
		why = moveTimeout
	}
	l.move(math.Max(1, l.limit*backoffRatio), why)
	// The interval under way mixed the partner's states: start anew.
	l.from, l.n, l.ok, l.sum, l.errs, l.peak = now, 0, 0, 0, 0, 0
}

// close ends the interval: at most one rule moves the limit, and the
// interval's errors join the error rate at its load (the most posts in
// flight: the limit, with a backlog).
func (l *limiter) close(now time.Time) {
	n, errs, load := float64(l.n), float64(l.errs), float64(l.peak)
	saturated := float64(l.peak+1) >= math.Floor(l.limit)*0.9
	ok, sum := l.ok, l.sum
	l.from, l.n, l.ok, l.sum, l.errs, l.peak = now, 0, 0, 0, 0, 0
	l.gentle = l.gentle || errs > 0

	// The rate rose with our load when the interval's errors are over
	// what the rate at about half the load or less predicts (λ) by more
	// than noise: the count's own (√λ) and the reference's, estimated
	// from refAnswers answers (λ·n/refAnswers). The reference's rate
	// counts one error more than it saw (Laplace's rule of succession): a
	// reference without an error says the rate is below about
	// 1/refAnswers, not zero (after a slow start each lower load has
	// one interval of answers; a steady 0.1 % of 500s then showed none
	// there and cut on four errors at the cap).
	refErrs, refAnswers := l.reference(load)
	rose := false
	if refAnswers >= errMinAnswers {
		lambda := n * (refErrs + 1) / refAnswers
		noise := math.Sqrt(lambda * (1 + n/refAnswers))
		rose = errs > math.Max(errRatio*lambda, lambda+errSigmas*noise)+errSlack
	}
	l.rules(now, ok, sum, saturated, rose)
	b := &l.errRates[errBucket(load)]
	decay := math.Exp(-now.Sub(b.at).Seconds() / errWindow.Seconds())
	b.errs, b.answers, b.at = b.errs*decay+errs, b.answers*decay+n, now
}

// reference is the errors and answers seen at about half the load or
// less: two buckets down (at most 0.5 to 0.7 × load) and below.
func (l *limiter) reference(load float64) (errs, answers float64) {
	for _, b := range l.errRates[:max(0, errBucket(load)-1)] {
		errs, answers = errs+b.errs, answers+b.answers
	}
	return errs, answers
}

// errBucket is the error rate's bucket of a load: √2 apart.
func errBucket(load float64) int {
	return min(errBuckets-1, int(2*math.Log2(math.Max(1, load))))
}

// rules applies the first rule that holds: the error rate rose, the
// latency rose, the partner keeps up with a backlog waiting.
func (l *limiter) rules(now time.Time, ok int, sum time.Duration, saturated, rose bool) {
	floor := math.Min(l.start, l.limit) // of latency and rate cuts
	// A rise in the slow start ends it without a cut: its references are
	// one interval at each lower load, too few to cut on one count (a
	// steady 0.1 % of 500s would); the next intervals, growing by
	// √limit, judge the rate again.
	hold := rose && l.slowStart
	if hold {
		l.slowStart, rose = false, false
	}
	if rose {
		l.move(math.Max(floor, l.limit*rateCut), moveErrorRate)
		if _, below := l.reference(l.limit); below < errMinAnswers {
			// Cut down to where no lower rate is known (--concurrency):
			// the rate rose at every limit we can judge, not with our
			// load. Forget the rates: the climb back measures them anew.
			l.errRates = [errBuckets]errRate{}
		}
	}
	if ok < minSamples {
		return // too few round trips for a mean
	}
	mean := sum / time.Duration(ok)
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
	threshold := l.threshold()
	if mean > time.Duration(float64(l.baseline)*slowStartTolerance)+rttSlack {
		l.gentle = true
	}
	switch {
	case rose:
	case mean > threshold:
		next := math.Max(floor, l.limit*math.Max(0.5, float64(threshold)/float64(mean)))
		l.move(next, moveLatency)
	case hold:
	case saturated && l.limit < l.max:
		step := math.Max(1, math.Sqrt(l.limit))
		if l.slowStart {
			f := slowStartGrowth
			if l.gentle {
				f = slowStartGentle
			}
			step = math.Max(step, l.limit*(f-1))
		}
		l.move(math.Min(l.max, l.limit+step), moveGrow)
	}
}

// move sets the limit to next (why: one of the move* reasons); any move but
// growth ends the slow start.
func (l *limiter) move(next float64, why string) {
	if why != moveGrow {
		l.slowStart = false
	}
	if math.Floor(next) == math.Floor(l.limit) {
		l.limit = next
		return
	}
	l.limit = next
	l.reason = why
	l.moves[why]++
}
