package reporter

import (
	"context"
	"slices"

	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// Parking a hanging track's reports without another post.
//
// Once a suspect track's own retry budget is spent (suspect.go: its
// reports' failures together, or one report's whole budget), the track
// hangs for good: another post of one of its reports would hold a slot
// for the whole --api-timeout and end in one more failure. A report posted
// when the budget ran out is parked at its failure (budgetSpent). The
// others are parked where they wait, without another post:
//
//   - at once, in the coordinator's next pass (sweepHanging): the retries
//     waiting their backoff (delayed) or a retry slot (ready), the fresh
//     reports waiting aside for a slot of their suspect track (aside), and
//     the reports leased and not posted yet (leased: the lease is given up);
//   - later, when they come to be leased or posted (take, next): the
//     track's fresh reports as they arrive, and those its partitions held
//     back past their progress windows, once the commit points move.
//
// A report whose post is out is never parked while it is out: its answer
// decides (parked at its failure, or final; an answer clears the track).
// The parked state is written as a worker's park writes it (setAside): the
// entry in <prefix>.parked, then a Delivery record with outcome parked and
// the source flags "fp", then the offset settled. The record repeats the
// report's last answer (status, retry reason, attempt), its message saying
// why no post was made; a report never posted has attempt 0, status 0 and
// a message saying it was not posted. The record carries no doubt cause of
// its own (no post), only one carried from a post that left no record
// (delivery.Doubt). The slow lane then retries them like any parked
// report; the parked-state fence and the lane's one-poster rule apply
// from there.

// Messages of the parked records of a hanging track's reports.
const (
	hangNotPosted = "not posted: its track hangs (its reports spent the track's retry budget); parked without a post"
	hangNoRepost  = "its track hangs (its reports spent the track's retry budget): parked without another post; last answer: "
)

// noteHanging asks the coordinator to sweep the queues once track started
// to hang (was: it hung before this failure) (mu held).
func (rn *run) noteHanging(track int64, was bool) {
	if was || !rn.thr.lim.sus.hangs(track) {
		return
	}
	rn.hangSweep = true
	rn.poke()
}

// hangs reports whether j's track hangs now: its report is parked rather
// than posted (mu held).
func (rn *run) hangs(j *job) bool { return rn.thr.lim.sus.hangs(j.track) }

// sweepHanging takes the reports of hanging tracks out of the queues where
// they wait and queues them for parking (mu held; it takes the partitions'
// locks and idMu in turn). Reports of a partition being revoked stay where
// they are (take and next drop them).
func (rn *run) sweepHanging() {
	if rn.stopping.Load() {
		return
	}
	var delayed delayQueue
	for _, j := range rn.delayed {
		if !rn.swept(j) {
			delayed = append(delayed, j)
		}
	}
	if len(delayed) != len(rn.delayed) {
		clear(rn.delayed)
		rn.delayed = delayed
		rn.delayed.init()
	}
	rn.ready = rn.sweepFifo(rn.ready)
	rn.aside = rn.sweepFifo(rn.aside)
	n := rn.leased.len()
	var leased fifo
	for range n {
		j := rn.leased.pop()
		ps := j.ps
		if !rn.hangs(j) || ps.revoking.Load() || ps.dropped.Load() {
			leased.push(j)
			continue
		}
		ps.mu.Lock()
		rn.unlease(j)
		ps.mu.Unlock()
		rn.freeRetrySlot(j)
		rn.queuePark(j)
	}
	rn.leased = leased
}

// sweepFifo is q without the reports of hanging tracks, which are queued
// for parking (mu held).
func (rn *run) sweepFifo(q fifo) fifo {
	n := q.len()
	if n == 0 || !slices.ContainsFunc(q.all(), rn.hangs) {
		return q
	}
	var keep fifo
	for range n {
		if j := q.pop(); !rn.swept(j) {
			keep.push(j)
		}
	}
	return keep
}

// swept takes j, waiting in a queue, out of it when its track hangs and
// its partition is still ours: queued for parking once admitted (a report
// not admitted went where admit puts it). It reports whether j left its
// queue (mu held).
func (rn *run) swept(j *job) bool {
	if !rn.hangs(j) || j.ps.revoking.Load() || j.ps.dropped.Load() {
		return false
	}
	if rn.admit(j) {
		rn.queuePark(j)
	}
	return true
}

// queuePark queues j, admitted (take's checks passed: it is active, within
// its partition's progress window) and not out, for parking without a post
// (mu held; it takes j.ps.mu). Its partition counts it in flight until the
// park is on record (a revocation waits for it), like a worker's park.
func (rn *run) queuePark(j *job) {
	ps := j.ps
	ps.mu.Lock()
	ps.inflight++
	j.unacked++ // the parked record's: parked takes it back
	ps.mu.Unlock()
	j.unposted, j.trackHangs = true, true
	rn.notFailing(j)
	rn.hangPark = append(rn.hangPark, j)
	rn.poke()
}

// parkHanging starts parking the reports of hanging tracks queued for it
// (takeHanging) (the coordinator's, each pass; no lock held). They are
// started from a goroutine counted in publishing (finish waits for it);
// each park's writes then run in a goroutine of their own, counted in
// parking (setAside).
func (rn *run) parkHanging() {
	batch := rn.takeHanging()
	if len(batch) == 0 {
		return
	}
	rn.publishing.Add(1)
	go func() {
		defer rn.publishing.Done()
		for _, j := range batch {
			rn.parkUnposted(j)
		}
	}()
}

// takeHanging sweeps the queues when a track started to hang and returns
// the reports queued for parking without a post (no lock held).
func (rn *run) takeHanging() []*job {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.hangSweep {
		rn.hangSweep = false
		rn.sweepHanging()
	}
	batch := rn.hangPark
	rn.hangPark = nil
	return batch
}

// parkUnposted parks j, queued by queuePark, without a post (no lock
// held). A partition revoked meanwhile keeps it: it is released, not
// parked (the next owner posts it).
func (rn *run) parkUnposted(j *job) {
	ps := j.ps
	ps.mu.Lock()
	if ps.revoking.Load() || ps.dropped.Load() {
		ps.inflight--
		rn.answerAcked(j)
		ps.mu.Unlock()
		rn.mu.Lock()
		rn.idMu.Lock()
		rn.release(j)
		rn.idMu.Unlock()
		rn.mu.Unlock()
		rn.poke() // a revocation may wait for it
		return
	}
	ps.mu.Unlock()
	j.dec = hangDecision(j)
	j.latency, j.held = 0, 0
	rec := rn.deliveryRecord(context.Background(), j)
	asParked(rec)
	rn.setAside(j, rn.parkEntry(j), rec, func() {})
}

// hangDecision is the decision the parked record of j, parked without a
// post, carries: its last answer's status and retry reason with a message
// saying why it was not posted again, or, for a report never posted, no
// answer. No doubt cause of its own: nothing was sent.
func hangDecision(j *job) delivery.Decision {
	if j.attempt == 0 {
		return delivery.Decision{Action: delivery.ActRetry, Outcome: schemas.OutcomeRetry, Message: hangNotPosted}
	}
	d := j.dec
	last := d.Message
	if last == "" && d.Err != nil {
		last = d.Err.Error()
	}
	d.Action, d.Outcome, d.Doubt, d.Err, d.Renew = delivery.ActRetry, schemas.OutcomeRetry, "", nil, false
	d.Message = hangNoRepost + last
	return d
}
