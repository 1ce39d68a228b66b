package reporter

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/reporter/delivery"
)

// finalWithoutPost marks a job final that needs no post (no lock held but
// possibly mu: it takes j.ps.mu). It returns rq with the reports the
// partition's moved commit point lets back in (pushReady, requeue).
func (rn *run) finalWithoutPost(j *job, rq []*job) []*job {
	ps := j.ps
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.unsure, j)
	ps.dirty = true
	return rn.markDone(ps, j.seq, rq)
}

// answerAcked: the answer of one post of j is on record (or will never be,
// and j is in doubt) (j.ps.mu held).
func (rn *run) answerAcked(j *job) {
	j.unacked--
	if j.unacked <= 0 && !j.inDoubt && !j.leasedOnly {
		delete(j.ps.unsure, j)
	}
	j.ps.dirty = true
}

// limitSignal is the signal j's failed post (decision d) takes to the
// limiter's judgement (throttle.failure).
//
// A fresh report of a suspect track failed like its track's others: judged
// as a retry (its payload's, while others are answered). A failure of a
// report of a track suspect now is its payload's whatever else is out: at a
// small limit its post may be the only one (suspect.go).
//
// A report whose earlier failure was judged its payload's (others answered
// at their usual latency) fails for its payload again: its timeout never
// cuts the limit, even when no post started after it was answered — when
// every post out is such a report (its partition leased up to its progress
// window behind it), each timeout cut the limit, down to 1, and the rest
// waited behind one hanging post. Fresh reports' timeouts still tell an
// outage.
//
// Back-pressure is the partner's, whoever asked, with one exception: a 503
// without Retry-After to a report that failed before, while a post started
// after it was answered at the usual latency, is that report's. A partner
// (or its standby layer) that answers one payload 503 again and again
// while it takes every other report otherwise halves the limit at each of
// that report's retries, down to 1 (TestHeldReportAt4096OnApacheKafka on a
// slow machine: 3 038 of 12 000 reports in 3 minutes). A 503 to a fresh
// report, a 429, a Retry-After, and a 503 while nothing later is answered
// (an outage, a standby window) still cut.
func (rn *run) limitSignal(j *job, d delivery.Decision) delivery.Signal {
	sig := d.Signal
	retried := j.failures > 0 || j.suspect
	switch sig {
	case delivery.SignalTimeout, delivery.SignalPayload, delivery.SignalEdge, delivery.SignalConnection:
		if j.payloadFailed || rn.thr.lim.sus.is(j.track) {
			sig = delivery.SignalIsolated
		}
	case delivery.SignalBackPressure:
		if retried && d.Status == 503 && d.RetryAfter == 0 &&
			rn.thr.lim.judge(delivery.SignalPayload, j.postNo, true, j.held) == delivery.SignalIsolated {
			sig = delivery.SignalIsolated
		}
	}
	return sig
}

// posted applies the answer of j's post to the state (mu held; it takes
// idMu and the partition's lock in turn).
func (rn *run) posted(j *job) {
	ps, d := j.ps, j.dec
	now := rn.cfg.Now()
	rn.noteAnswer(d, now)
	if d.Action.Final() {
		rn.notFailing(j)
		rn.successes++
		rn.healthy(j)
		rn.idMu.Lock()
		rn.recent.add(j.id)
		rn.idMu.Unlock()
		if d.Action == delivery.ActRejected {
			rn.log.Warn("report rejected by the partner API", "report_id", j.id, "status", d.Status, "message", d.Message, "fields", d.Fields)
		}
		if rn.stopping.Load() {
			rn.poke()
		}
		return // ps.inflight drops when the Delivery record is persisted
	}
	switch {
	case d.Action == delivery.ActRetry && d.Reason != delivery.ReasonUnauthorized:
		before := math.Floor(rn.thr.lim.limit)
		sig := rn.limitSignal(j, d)
		switch rn.thr.failure(rn.cfg.Now(), sig, j.postNo, j.failures > 0 || j.suspect, j.held, rn.inflight+1) {
		case delivery.SignalIsolated, delivery.SignalPayload:
			j.payloadFailed = true
		case delivery.SignalTimeout, delivery.SignalBackPressure:
			rn.partnerFailed++ // the limiter took it for the partner's (park.go)
		}
		if rn.limitMoved(before) {
			rn.wakeWorkers()
		}
		if rn.thr.tokens < 1 {
			rn.poke() // the coordinator wakes the workers when a token is back
		}
	case d.Action == delivery.ActStandby:
	default:
		rn.healthy(j)
	}
	ps.mu.Lock()
	ps.inflight--
	if d.Action == delivery.ActAbandon {
		// Cancelled while in flight: it may have reached the partner, and
		// no answer will be recorded.
		if d.Doubt != "" {
			j.inDoubt = true
			j.carried = d.Doubt // no record of its own: the next one counts it
		}
		rn.answerAcked(j)
	}
	gone := ps.dropped.Load() || ps.revoking.Load()
	ps.mu.Unlock()
	if gone {
		rn.idMu.Lock()
		rn.release(j)
		rn.idMu.Unlock()
		rn.poke()
		return
	}
	switch d.Action {
	case delivery.ActStandby:
		rn.standbyAnswer(j)
	case delivery.ActRetry:
		if !d.Renew {
			rn.noteFailure(j, d, now)
		}
		if !d.Renew && rn.budgetSpent(j) {
			rn.notFailing(j)
			// Its budget is spent: the worker parks it (park.go). Its
			// partition counts it in flight until the park is on record.
			j.parking = true
			ps.mu.Lock()
			ps.inflight++
			ps.mu.Unlock()
			break
		}
		rn.retry(j)
	case delivery.ActStop:
		rn.idMu.Lock()
		rn.release(j)
		rn.idMu.Unlock()
		rn.stop(rn.configError(j, d), true)
	case delivery.ActAbandon:
		rn.idMu.Lock()
		rn.release(j)
		// Cancelled without a shutdown (cannot happen today): post again,
		// unless its partition was dropped meanwhile (checkRevocations
		// drops it before it forgets its active reports).
		again := !rn.stopping.Load() && !ps.dropped.Load()
		if again {
			rn.active[j.id] = j
		}
		rn.idMu.Unlock()
		if again {
			rn.ready.push(j)
			rn.jobsReady()
		}
	}
	if rn.stopping.Load() || rn.revoking.Load() > 0 {
		rn.poke()
	}
}

// retry queues j for another post after its backoff (mu held).
func (rn *run) retry(j *job) {
	d := j.dec
	j.failures++
	delay := time.Duration(0)
	if d.Renew {
		j.renews++
		// The first 401 retries at once (the client takes a new
		// session); repeated ones back off like transient failures.
		if j.renews > 1 {
			delay = rn.backoff.Delay(j.renews-1, 0)
		}
	} else {
		j.renews = 0
		step := j.failures
		if j.healthyFails >= 2 {
			// It failed again after other reports were answered: a fault of
			// this payload, not a blip of the partner. Quick retries would
			// only take posts (slots at the in-flight limit) from the
			// reports that succeed: it backs off as if slowStepsAhead
			// failures further (BackoffInitial 100 ms: 1.6–3.2 s after the
			// second failure, then 3.2–6.4 s, then BackoffMax).
			step += slowStepsAhead
		}
		delay = rn.backoff.Delay(step, d.RetryAfter)
	}
	rn.log.Debug("report post to be retried", "report_id", j.id, "attempt", j.attempt, "reason", d.Reason, "status", d.Status, "delay", delay)
	if delay <= 0 {
		rn.ready.push(j)
		rn.jobsReady()
		return
	}
	j.readyAt = rn.cfg.Now().Add(delay)
	rn.delayed.add(j)
	if rn.retryAt.IsZero() || j.readyAt.Before(rn.retryAt) {
		rn.poke() // the retry timer must fire earlier
	}
}

// slowStepsAhead is how many doublings further a report's backoff goes once
// it failed again while other reports were answered (retry).
const slowStepsAhead = 4

// healthy records an answer of a healthy partner (mu held): its round trip
// feeds the in-flight limit (an abandoned post, without an answer, does
// not); a grown limit wakes waiting workers.
func (rn *run) healthy(j *job) {
	if j.dec.Status == 0 {
		rn.thr.tokens = math.Min(rn.thr.max, rn.thr.tokens+rn.thr.ratio)
		return
	}
	if j.dec.Signal == delivery.SignalAnswer && rn.thr.lim.sus.answered(j.track) {
		rn.releaseAside() // its track is answered: not hanging
	}
	before := math.Floor(rn.thr.lim.limit)
	rn.thr.success(rn.cfg.Now(), j.dec.Signal, j.postNo, j.held, rn.inflight+1)
	if rn.limitMoved(before) {
		rn.wakeWorkers()
	}
}

// limitMoved counts and logs a move of the in-flight limit from before
// (mu held); it reports whether the limit grew.
func (rn *run) limitMoved(before float64) bool {
	l := rn.thr.lim
	after := math.Floor(l.limit)
	if after == before {
		return false
	}
	rn.met.limitMoved(l.reason)
	rn.noteLimit(rn.cfg.Now(), before, after, l.reason)
	rn.log.Debug("in-flight limit moved", "limit", after, "from", before, "reason", l.reason,
		"rtt_min", l.baseline, "rtt_recent", l.recent, "in_flight", rn.inflight)
	return after > before
}

// release forgets that j is on its way (not final), requeueing followers
// whose partition is still ours (mu and idMu held).
func (rn *run) release(j *job) {
	if rn.active[j.id] == j {
		delete(rn.active, j.id)
	}
	rn.notFailing(j)
	for _, f := range j.followers {
		if !f.ps.dropped.Load() && !f.ps.revoking.Load() && f.ps != j.ps {
			rn.ready.push(f)
		}
	}
	j.followers = nil
	rn.jobsReady()
}

// persisted applies the acknowledgement of a final Delivery record (a
// produce callback; no lock held). Under the partition's lock, the log
// position moves together with the report's final mark: a snapshot that
// saw the position without the mark would make the next owner skip that
// record of the log tail and post a final report again.
func (rn *run) persisted(j *job, r *kgo.Record, err error) {
	if err != nil {
		rn.stop(fmt.Errorf("reporter: publish delivery record of report %s: %w", j.id, err), false)
		return
	}
	ps := j.ps
	var rq []*job
	ps.mu.Lock()
	ps.noteLog(r)
	ps.inflight--
	delete(ps.unsure, j)
	ps.dirty = true
	dropped := ps.dropped.Load()
	rq = rn.markDone(ps, j.seq, rq)
	ps.mu.Unlock()
	rn.idMu.Lock()
	if rn.active[j.id] == j {
		delete(rn.active, j.id)
	}
	followers := j.followers
	j.followers = nil
	rn.idMu.Unlock()
	if !dropped {
		// Twins that waited for this outcome: final without a post.
		for _, f := range followers {
			if !f.ps.dropped.Load() {
				rn.met.skip(context.Background(), "duplicate")
				rq = rn.finalWithoutPost(f, rq)
			}
		}
	}
	rn.requeue(rq)
	if rn.revoking.Load() > 0 {
		rn.poke() // a revocation may wait for this partition's posts
	}
}

// markDone records a final outcome in the partition's tracker (ps.mu held)
// and returns rq with the reports its moved commit point lets back in. A
// dropped partition's tracker is gone: nothing changes.
func (rn *run) markDone(ps *partState, seq uint64, rq []*job) []*job {
	if ps.dropped.Load() {
		return rq
	}
	ps.dirty = true
	if n := ps.wm.markDone(seq); n > 0 {
		rq = ps.unheld(rq)
		rn.resumeIfRoom(ps)
		if rn.pending.Add(-int64(n)) < int64(rn.cfg.MaxPending) {
			select {
			case rn.room <- struct{}{}:
			default:
			}
		}
	}
	return rq
}
