package reporter

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// slowRetry posts one parked report once (a goroutine of the slow lane; no
// lock held); e is its entry, read back from <prefix>.parked. Nothing it meets stops the run but the partner refusing the
// reporter's credentials: a post that times out is a failed attempt like
// any other (recorded as parked, due again later), and a record Kafka
// fails leaves the report parked, its next post labelled in doubt.
//
// Its writes of the partition's parked state are fenced by ownership: it
// starts only while the partition is this run's and not revoking, and the
// partition's revocation cancels its post and waits for it to end
// (slowStart, checkRevocations), so the next owner's writes come after
// its last one. A partition lost without notice (this process paused past
// its session) is fenced by Kafka: every write goes through the
// partition's transactional fence, which the next owner claimed
// (parkfence.go), and a refused write ends the retry with nothing
// recorded.
func (rn *run) slowRetry(it *parkedItem, e *schemas.Parked) {
	ctx, ok := rn.slowStart(it.ps)
	if !ok {
		rn.slow.done(it)
		return
	}
	defer rn.slowEnd(it.ps)
	rn.mu.Lock()
	standby := rn.standby != nil
	rn.mu.Unlock()
	if standby {
		rn.slowAgain(it, rn.cfg.ProbeInterval*4, false) // the dispatch is held: so is the lane
		return
	}
	if d, held := rn.paused.holding(); held {
		rn.slowAgain(it, d, false) // paused a moment ago: the group says first what is still ours
		return
	}
	start := time.Now() // real time on purpose: the pause fence's (pausefence.go)
	// 1. The entry says a post is about to start: a reader that finds it so
	// (this process died mid-retry) posts again labelled in doubt.
	e.Posting = true
	r, err := rn.parkWrite(it.ps.key.partition, rn.parkRecord(it.pp, e.ReportID, e))
	if err != nil {
		if ended(err) {
			rn.slow.done(it)
			return
		}
		rn.log.Warn("slow retry of a parked report postponed: its entry could not be written", "report_id", e.ReportID, "err", err)
		rn.slowAgain(it, rn.slowDelay(e.Stage), false)
		return
	}
	it.off = r.Offset
	// From here to the entry's next state, the next owner must read this
	// retry's answer: progress snapshots keep the log position before it.
	pos := hold(it.ps)
	defer unhold(it.ps, pos)
	// 2. One post, classified like any other (an operator's redrive
	// request it serves names the redrive in the record).
	req, asked := rn.slow.serving(it)
	j := &job{redrive: req.q, ps: it.ps, rec: &kgo.Record{Topic: e.Source.Topic, Partition: e.Source.Partition, Offset: e.Source.Offset},
		id: e.ReportID, evID: e.EventID, body: e.Report, attempt: e.Attempts, inDoubt: e.InDoubt, carried: it.carried, ctx: ctx}
	var rec *kgo.Record
	for range 2 { // a 401 renews the session: once more at once
		rec = rn.post(j)
		if rec != nil && j.dec.Action != delivery.ActAbandon && j.dec.Action != delivery.ActStop && rn.paused.stalled(start) {
			// Paused mid-retry, maybe past the session: the partition may be
			// another's, who wrote its state since. Nothing recorded.
			rn.slowUnrecorded(it, e, j, errStalled)
			return
		}
		if j.dec.Action != delivery.ActRetry || !j.dec.Renew || rec == nil {
			break
		}
		if err := rn.slowPublish(it.ps, rec); err != nil {
			rn.slowUnrecorded(it, e, j, err)
			return
		}
		j.carried = ""
	}
	it.carried = ""
	if j.dec.Doubt != "" {
		j.inDoubt = true
	}
	d := j.dec
	e.Attempts, e.InDoubt = j.attempt, j.inDoubt
	switch {
	case d.Action == delivery.ActAbandon || rec == nil:
		// Shutdown or revocation cancelled the post. The entry says why
		// (the revocation waits for this retry: the fence is still this
		// run's): the next owner posts again labelled cancelled when the
		// request may have left, without a label when it had not. If the
		// write fails the entry keeps Posting: labelled crash.
		if d.Action == delivery.ActAbandon {
			rn.slowCancelled(it, e, j)
		}
		rn.slow.done(it)
		return
	case d.Action == delivery.ActStop:
		rn.slow.done(it)
		rn.stop(rn.configError(j, d), true)
		return
	case d.Action.Final():
		// 3. The answer on record, then the entry gone.
		if err := rn.slowPublish(it.ps, rec); err != nil {
			rn.slowUnrecorded(it, e, j, err)
			return
		}
		if _, err := rn.parkWrite(it.ps.key.partition, rn.parkRecord(it.pp, e.ReportID, nil)); err != nil && !ended(err) {
			rn.log.Warn("parked report final, its entry not removed: its next owner finds the final answer in the deliveries log", "report_id", e.ReportID, "err", err)
		}
		rn.slow.done(it)
		rn.slowAnswered(it, req, asked)
		if newer, ok := rn.slow.served(it, req); ok {
			rn.unrequest(newer, "the report is final")
		}
		rn.met.unparked(context.Background(), d.Outcome)
		rn.log.Info("parked report final", "report_id", e.ReportID, "outcome", d.Outcome, "attempts", j.attempt, "in_doubt", j.inDoubt)
		rn.idMu.Lock()
		rn.recent.add(e.ReportID)
		rn.idMu.Unlock()
		return
	}
	// Not final (a transient failure, a timeout included, or standby): the
	// answer on record as parked, then the entry's next state, due on the
	// slow schedule.
	if d.Action == delivery.ActRetry {
		asParked(rec)
		e.Stage++
	}
	e.Status, e.Reason, e.Message = d.Status, d.Reason, d.Message
	if e.Message == "" && d.Err != nil {
		e.Message = d.Err.Error()
	}
	if err := rn.slowPublish(it.ps, rec); err != nil {
		rn.slowUnrecorded(it, e, j, err)
		return
	}
	e.Posting, e.Doubt = false, "" // a cancelled post's cause: carried by this post's record
	if r, err := rn.parkWrite(it.ps.key.partition, rn.parkRecord(it.pp, e.ReportID, e)); err != nil {
		if ended(err) {
			rn.slow.done(it)
			return
		}
		rn.log.Warn("parked report's next state not written: its next owner posts it again, labelled in doubt", "report_id", e.ReportID, "err", err)
		e.InDoubt = true
	} else {
		it.off = r.Offset
	}
	rn.slowAnswered(it, req, asked)
	it.keep(e)
	rn.slowAgain(it, rn.slowDelay(e.Stage), true)
}

// slowCancelled writes the entry of a slow retry whose post was
// cancelled (j's decision: abandon): posting no more, in doubt with the
// cause DoubtCancelled when the request may have left.
func (rn *run) slowCancelled(it *parkedItem, e *schemas.Parked, j *job) {
	e.Posting, e.Attempts = false, j.attempt
	if j.dec.Doubt != "" {
		e.InDoubt, e.Doubt = true, j.dec.Doubt
	}
	if _, err := rn.parkWrite(it.ps.key.partition, rn.parkRecord(it.pp, e.ReportID, e)); err != nil && !ended(err) {
		rn.log.Warn("cancelled slow retry's entry not written: its next owner posts it again labelled crash", "report_id", e.ReportID, "err", err)
	}
}

// errStalled is the cause of a slow retry's answer left unrecorded by the
// pause fence (pausefence.go).
var errStalled = errors.New("this process was paused during the slow retry: its answer is not recorded (the partition may be another's)")

// slowAnswered removes the redrive request the slow retry of it served
// (its answer is on record), if any.
func (rn *run) slowAnswered(it *parkedItem, req foundRequest, asked bool) {
	if asked {
		rn.unrequest(req, "posted: the answer is on record")
		rn.slow.served(it, req)
	}
}

// slowUnrecorded handles a slow retry whose answer's Delivery record Kafka
// failed (err): the answer is not on record, and the entry still says
// posting. The report stays parked, due again on the slow schedule; its
// next record counts the post whose answer was lost
// (schemas.DoubtUnrecorded). Never a reason to stop the run.
func (rn *run) slowUnrecorded(it *parkedItem, e *schemas.Parked, j *job, err error) {
	if ended(err) {
		rn.slow.done(it)
		return
	}
	rn.log.Warn("the answer of a parked report's slow retry could not be recorded: the report stays parked, its next post labelled in doubt",
		"report_id", e.ReportID, "partner", rn.cfg.PartnerURL, "outcome", j.dec.Outcome, "status", j.dec.Status, "err", err)
	e.Attempts, e.InDoubt = j.attempt, true
	it.carried = schemas.DoubtUnrecorded
	e.Stage++
	it.keep(e)
	rn.slowAgain(it, rn.slowDelay(e.Stage), false)
}
