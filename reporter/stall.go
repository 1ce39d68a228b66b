package reporter

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/playpipe/playpipe/reporter/delivery"
)

// A stall is loud: a report failing once is a blip, a set of reports
// failing again and again is what an operator must hear of within a minute,
// whatever the per-report warnings (warnStuck, after WarnAfterAttempts) and
// the budget (ParkAfter) say later. The coordinator looks every stallCheck:
// the reports that failed at least twice, their last failure within
// stallStale, make one warning naming how many, their tracks, the last
// status (or timeout) and the oldest; again every stallRepeat while the set
// lasts, and once more when it is gone.
//
// The same bookkeeping answers readiness (Ready): reports pending and
// posted, none made final for stallReady while the partner answered
// (a status, or a timeout: it was reached) — the reporter runs and delivers
// nothing: degraded.

const (
	stallCheck  = 10 * time.Second // how often the coordinator looks
	stallStale  = 5 * time.Minute  // a report not failing for this long leaves the set
	stallRepeat = 5 * time.Minute  // the warning again while the set lasts
	stallReady  = time.Minute      // no final answer for this long: degraded
	stallTracks = 10               // tracks named in the warning
)

// failing is what the stall warning says of one report that failed (under
// run.mu): written when its answer is applied, never read from the job
// (its worker may be posting it).
type failing struct {
	id        string
	track     int64
	status    int
	reason    string
	fails     int
	firstFail time.Time
	lastFail  time.Time
}

// stallState is the reports failing and the warning's own state (run.mu).
type stallState struct {
	failing   map[*job]*failing
	warnedAt  time.Time // the last stall warning (zero: none in this stall)
	lastFinal time.Time // the last final answer
	lastReach time.Time // the last answer of the partner, or timeout
	lastPost  time.Time // the last answer of any kind (the reporter posts)
	firstPost time.Time // the first answer of any kind
	cutAt     time.Time // the last "in-flight limit cut" warning (zero: the limit is back)
}

// limitCutRepeat is how often the in-flight limit's cut warning may come
// again while the limit stays below --concurrency.
const limitCutRepeat = time.Minute

// noteLimit logs a move of the in-flight limit an operator must see (mu
// held): a cut below --concurrency for the partner's back-pressure or
// timeouts (a warning, at most once per limitCutRepeat: a partner that
// sheds load or hangs cuts it many times), and the limit back at
// --concurrency after such a warning. The other moves are at debug level.
func (rn *run) noteLimit(now time.Time, before, after float64, reason string) {
	floor := float64(rn.cfg.Concurrency)
	switch {
	case after < before && after < floor && (reason == moveBackPressure || reason == moveTimeout):
		if !rn.stall.cutAt.IsZero() && now.Sub(rn.stall.cutAt) < limitCutRepeat {
			return
		}
		rn.stall.cutAt = now
		rn.log.Warn("in-flight limit cut below --concurrency: the partner asks for less or does not answer in time",
			"limit", after, "from", before, "reason", reason, "concurrency", rn.cfg.Concurrency,
			"rtt_min", rn.thr.lim.baseline, "rtt_recent", rn.thr.lim.recent, "in_flight", rn.inflight)
	case after >= floor && !rn.stall.cutAt.IsZero():
		rn.stall.cutAt = time.Time{}
		rn.log.Info("in-flight limit back at --concurrency", "limit", after, "concurrency", rn.cfg.Concurrency)
	}
}

// noteFailure records a transient failure of j, answered d at now (mu
// held).
func (rn *run) noteFailure(j *job, d delivery.Decision, now time.Time) {
	if rn.stall.failing == nil {
		rn.stall.failing = map[*job]*failing{}
	}
	f := rn.stall.failing[j]
	if f == nil {
		f = &failing{id: j.id, track: trackKey(j.body), firstFail: now}
		rn.stall.failing[j] = f
	}
	f.fails++
	f.lastFail, f.status, f.reason = now, d.Status, d.Reason
}

// noteAnswer records the time of an answer of j's post for readiness (mu
// held).
func (rn *run) noteAnswer(d delivery.Decision, now time.Time) {
	rn.stall.lastPost = now
	if rn.stall.firstPost.IsZero() {
		rn.stall.firstPost = now
	}
	if d.Status != 0 || d.Reason == delivery.ReasonTimeout {
		rn.stall.lastReach = now
	}
	if d.Action.Final() {
		rn.stall.lastFinal = now
	}
}

// notFailing forgets j's failures: final, parked or no longer ours (mu
// held).
func (rn *run) notFailing(j *job) { delete(rn.stall.failing, j) }

// checkStall logs the stall warning when it is due (mu held).
func (rn *run) checkStall(now time.Time) {
	var set []*failing
	for j, f := range rn.stall.failing {
		switch {
		case now.Sub(f.lastFail) > stallStale:
			delete(rn.stall.failing, j)
		case f.fails >= 2:
			set = append(set, f)
		}
	}
	if len(set) == 0 {
		if !rn.stall.warnedAt.IsZero() {
			rn.stall.warnedAt = time.Time{}
			rn.log.Info("delivery no longer stalled: no report keeps failing")
		}
		return
	}
	if !rn.stall.warnedAt.IsZero() && now.Sub(rn.stall.warnedAt) < stallRepeat {
		return
	}
	rn.stall.warnedAt = now
	slices.SortFunc(set, func(a, b *failing) int { return cmp.Or(a.firstFail.Compare(b.firstFail), cmp.Compare(a.id, b.id)) })
	oldest, last := set[0], set[0]
	byTrack := map[int64]int{}
	for _, f := range set {
		byTrack[f.track]++
		if f.lastFail.After(last.lastFail) {
			last = f
		}
	}
	tracks := make([]int64, 0, len(byTrack))
	for t := range byTrack {
		tracks = append(tracks, t)
	}
	slices.SortFunc(tracks, func(a, b int64) int { return cmp.Or(cmp.Compare(byTrack[b], byTrack[a]), cmp.Compare(a, b)) })
	if len(tracks) > stallTracks {
		tracks = tracks[:stallTracks]
	}
	rn.log.Warn("delivery stalled: reports keep failing; each holds its partition's commit point until delivered or parked",
		"reports", len(set), "tracks", tracks, "distinct_tracks", len(byTrack),
		"last_status", lastAnswer(last), "oldest_report_id", oldest.id, "oldest_track_id", oldest.track,
		"oldest_failing_for", now.Sub(oldest.firstFail).Round(time.Second), "oldest_failures", oldest.fails,
		"in_flight_limit", int(rn.thr.lim.limit), "park_after_attempts", rn.cfg.ParkAfterAttempts, "park_after", rn.cfg.ParkAfter)
}

// lastAnswer names a failure's answer: its status, or its reason when none
// came (timeout, connection).
func lastAnswer(f *failing) string {
	if f.status != 0 {
		return fmt.Sprint(f.status)
	}
	return cmp.Or(f.reason, "no answer")
}

// failingNow is how many reports failed at least twice and are still
// failing (mu held).
func (rn *run) failingNow() int {
	n := 0
	for _, f := range rn.stall.failing {
		if f.fails >= 2 {
			n++
		}
	}
	return n
}

// errDegraded is wrapped by Ready's error.
var errDegraded = errors.New("reporter degraded")

// readiness is Ready's answer for the run (mu held): degraded while reports are
// posted, the partner reached, and none was made final for stallReady.
func (rn *run) readiness(now time.Time) error {
	st := &rn.stall
	if st.lastPost.IsZero() || now.Sub(st.lastPost) > stallReady || now.Sub(st.lastReach) > stallReady {
		return nil // not posting, or the partner is not reached: not a stall of ours
	}
	since := cmp.Or(st.lastFinal, st.firstPost)
	if now.Sub(since) <= stallReady {
		return nil
	}
	n := rn.failingNow()
	return fmt.Errorf("%w: nothing delivered for %v while the partner answers (%d reports failing repeatedly, in-flight limit %d)",
		errDegraded, now.Sub(since).Round(time.Second), n, int(rn.thr.lim.limit))
}

// Ready reports whether the running reporter delivers: an error wrapping
// errDegraded while it posts reports, the partner answers, and none was
// delivered or rejected for a minute (a stall: every report posted keeps
// failing). Nil while not running. The report role serves it at /readyz.
func (r *Reporter) Ready() error {
	rn := r.cur.Load()
	if rn == nil {
		return nil
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.readiness(rn.cfg.Now())
}
