package reporter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// Parking: one report never holds up the others (docs/design.md).
//
// A report whose transient failures outlast its retry budget
// (Config.ParkAfterAttempts failures AND Config.ParkAfter of time, counting
// only failures and time while other reports got a final answer) is parked:
//
//  1. its state — body, source offset, attempts, last answer, doubt — is
//     written to <prefix>.parked (compacted, key = report id, partition of
//     its reports partition) and acknowledged;
//  2. then its last attempt's Delivery record is published with outcome
//     parked and the source flags "fp": recovery (recover.go) reads "f" and
//     never posts the offset again from <prefix>.reports;
//  3. once that record is acknowledged, the offset is settled: the
//     partition's commit point moves past it like past a final report.
//
// A crash between 1 and 2 leaves an entry whose offset is not settled: the
// recovery of the partition (recoverParked) tombstones such orphans before
// anything of the partition is leased, and the report is posted from
// <prefix>.reports as usual. A crash between 2 and 3 leaves the offset final
// in the log tail, and the entry valid.
//
// The slow lane (slowLane) retries the parked reports of the partitions
// this run owns on the schedule Config.ParkRetries, up to slowConcurrency
// at once (slowretry.go): before a post it writes the entry with Posting
// set (acknowledged), then posts, publishes the answer's Delivery record,
// and then writes the entry's next state, or a tombstone when the answer
// is final. A reader that finds Posting set (the writer died mid-retry)
// posts again labelled in doubt, so a parked report is delivered at most
// once more than its posts in doubt, and every possible double is
// labelled. The lane is a parked report's one poster: an operator's
// `redrive --parked` asks it (redrive.go), and a revocation waits for the
// partition's slow retries, so no write of parked state lands after the
// next owner's.

// budgetSpent counts a transient failure of j against its retry budget and
// reports whether the budget is spent (mu held; it takes j.ps.mu). A
// failure, and the time since the report's previous failure, count only
// when another report got a final answer in between: while the whole
// partner fails, no report's budget moves (the reporter backs off as a
// whole instead).
//
// A hanging report (each post running into the API timeout) spends its
// budget like any other: the in-flight limit does not collapse on its
// timeouts (limiter.judge) and its retries hold at most retryCap slots, so
// the other reports keep getting answers while it hangs, and each of its
// failures counts.
//
// The pressure rule spends it early: a report that holds its partition's
// commit point, and failed pressureParkFails times not in a whole-partner
// outage (each failure after another report got a final answer, or with no
// other post failing since its previous one: it fails alone),
// is parked as soon as its partition holds MaxPending records — fetching of
// the partition has stopped behind it — or holds reports back past its
// progress window (lease.go: leasing of the partition has stopped behind
// it; the window, 15 185 offsets at Kafka's default commit metadata, is
// smaller than the default MaxPending, so a partition stops there first).
// Waiting out ParkAfter would stall the partition for minutes at any real
// rate (16 384 records at 1 000 a second fill it in 16 s). A report behind another pending one is not
// what holds the partition: parking it would free nothing.
func (rn *run) budgetSpent(j *job) bool {
	now := rn.cfg.Now()
	rn.failed++
	switch {
	case j.lastFailAt.IsZero():
		j.healthyFails, j.pressureFails = 1, 1
	case rn.successes > j.succAt:
		j.healthyFails++
		j.pressureFails++
		j.budgetUsed += now.Sub(j.lastFailAt)
	case rn.failed == j.failedAt+1 || rn.partnerFailed == j.partnerFailedAt:
		// Nothing else was answered or failed since, or nothing that failed
		// since looked like the partner's (reports of a hanging payload, its
		// own included): it fails alone (its full partition waits behind
		// it), not in an outage.
		j.pressureFails++
	}
	j.lastFailAt, j.succAt, j.failedAt, j.partnerFailedAt = now, rn.successes, rn.failed, rn.partnerFailed
	// The track's budget: its reports' failures together (suspect.go).
	// Once it is spent, the track's reports waiting are parked without
	// another post (parkhang.go).
	hung := rn.thr.lim.sus.hangs(j.track)
	rn.thr.lim.sus.failed(j.track, now, rn.cfg.ParkAfterAttempts, rn.cfg.ParkAfter)
	rn.noteHanging(j.track, hung)
	if j.attempt >= rn.cfg.WarnAfterAttempts && !j.warned {
		j.warned = true
		rn.warnStuck(j)
	}
	if rn.cfg.ParkAfterAttempts < 0 {
		return false
	}
	if j.healthyFails >= rn.cfg.ParkAfterAttempts && j.budgetUsed >= rn.cfg.ParkAfter {
		rn.thr.lim.sus.parkedOne(j.track)
		rn.noteHanging(j.track, hung)
		return true
	}
	if rn.thr.lim.sus.hangs(j.track) {
		// Another report of its track, suspect, spent its whole budget
		// (suspect.go): this one's first failure is enough.
		j.trackHangs = true
		return true
	}
	if j.pressureFails < pressureParkFails {
		return false
	}
	j.ps.mu.Lock()
	full := (j.ps.wm.pending() >= rn.cfg.MaxPending || j.ps.pastWindow.len() > 0) && j.ps.wm.holds(j.seq)
	j.ps.mu.Unlock()
	j.pressured = full
	return full
}

// pressureParkFails is the failures after which the pressure rule may park
// a report (budgetSpent).
const pressureParkFails = 3

// warnBurst is how many stuck-report warnings may come at once.
const warnBurst = 20

// warnStuck logs that j keeps failing (once per report; at most a burst of
// warnBurst, then one a second, the rest counted in the next line).
func (rn *run) warnStuck(j *job) {
	if !rn.warnLimit.Allow() {
		rn.warnSuppressed++
		return
	}
	d := j.dec
	rn.log.Warn("report keeps failing: it holds its partition's commit point until it is delivered or parked",
		"report_id", j.id, "track_id", trackKey(j.body), "status", d.Status, "reason", d.Reason, "message", d.Message,
		"attempts", j.attempt, "failing_for", j.budgetUsed.Round(time.Second), "partition", j.rec.Partition, "offset", j.rec.Offset,
		"park_after_attempts", rn.cfg.ParkAfterAttempts, "park_after", rn.cfg.ParkAfter, "warnings_suppressed", rn.warnSuppressed)
	rn.warnSuppressed = 0
}

// parkedPart is the partition of <prefix>.parked where a report of reports
// partition p is parked (kafkax.ParkedPartition: the rule redrive shares).
// Its later states go to the partition its entry is in (parkedItem.pp).
func (rn *run) parkedPart(p int32) int32 { return kafkax.ParkedPartition(p, rn.parkedParts) }

// parkEntry is the parked state of j after its last answer, due after the
// first delay of the slow schedule.
func (rn *run) parkEntry(j *job) *schemas.Parked {
	now := rn.cfg.Now()
	d := j.dec
	msg := d.Message
	if msg == "" && d.Err != nil {
		msg = d.Err.Error()
	}
	j.ps.mu.Lock()
	inDoubt := j.inDoubt // an earlier attempt's record acknowledged late writes it under the lock
	j.ps.mu.Unlock()
	return &schemas.Parked{
		V: schemas.ParkedVersion, ReportID: j.id, EventID: j.evID,
		Source: schemas.Source{Topic: j.rec.Topic, Partition: j.rec.Partition, Offset: j.rec.Offset},
		Report: j.body, Attempts: j.attempt, Due: now.Add(rn.cfg.ParkRetries[0]).UnixMilli(),
		Status: d.Status, Reason: d.Reason, Message: msg, InDoubt: inDoubt, ParkedAt: now.UnixMilli(),
	}
}

// parkRecord is the record of e in partition pp of <prefix>.parked (a
// tombstone for a nil e).
func (rn *run) parkRecord(pp int32, id string, e *schemas.Parked) *kgo.Record {
	r := &kgo.Record{Topic: rn.topics.Parked, Partition: pp, Key: []byte(id)}
	if e != nil {
		r.Value, _ = json.Marshal(e) // plain fields: cannot fail
	}
	return r
}

// park sets j aside (the worker's, after posted marked it parking; no lock
// held): rec is its last attempt's Delivery record, published as parked
// once its entry is in <prefix>.parked. The caller counted rec in
// unrecorded (recorded runs once its fate is known); the writes run in a
// goroutine counted in parking (setAside).
func (rn *run) park(j *job, rec *kgo.Record) {
	e := rn.parkEntry(j)
	asParked(rec)
	rn.setAside(j, e, rec, rn.recorded)
}

// setAside writes e, j's entry, to <prefix>.parked through the
// partition's parked-state fence (parkfence.go) and then rec, its parked
// Delivery record (no lock held); once both are acknowledged the offset is
// settled (parked). recorded runs once rec's fate is known (a worker's park
// counted it in unrecorded).
//
// The entry is fenced like every later state of it: a process that lost
// the partition without being told (paused past its session) and wakes
// with the entry handed to its client but not yet sent must not write it
// after its successor delivered the report and removed it. Its write fails
// as fenced, and the report is its successor's. The fenced write waits for
// its transaction (group-committed with the partition's other writes), so
// it runs in a goroutine of the run's (bg), counted in parking: a shutdown
// waits for it until its deadline (coordinate), and the run's end ends it.
func (rn *run) setAside(j *job, e *schemas.Parked, rec *kgo.Record, recorded func()) {
	rn.parking.Add(1)
	rn.bg.Go(func() {
		defer rn.poke() // a shutdown or a revocation may wait for it
		defer rn.parking.Add(-1)
		entry, err := rn.writeEntry(j, e)
		if err != nil {
			recorded()
			if !ended(err) {
				rn.stop(fmt.Errorf("reporter: park report %s: %w", j.id, err), false)
				return
			}
			if errors.Is(err, errFenced) {
				rn.log.Warn("report not parked: its partition's parked state is another reporter's now (this process lost the partition); the report is its to deliver",
					"report_id", j.id, "partition", j.rec.Partition, "offset", j.rec.Offset, "err", err)
			}
			return
		}
		rn.produce(rec, func(r *kgo.Record, err error) {
			recorded()
			if err != nil {
				if !errors.Is(err, kgo.ErrClientClosed) {
					rn.stop(fmt.Errorf("reporter: publish the parked record of report %s: %w", j.id, err), false)
				}
				return
			}
			rn.parked(j, r, e, entry.Offset)
		})
	})
}

// parkEntryTries is how many times a park tries its entry's fenced write
// when the broker refuses it with an error other than the fence's: the
// first write after another process claimed the fence meets the old
// producer epoch (INVALID_PRODUCER_EPOCH), the next one PRODUCER_FENCED.
const parkEntryTries = 3

// writeEntry writes e, j's first entry, through its partition's fence and
// returns the record written.
func (rn *run) writeEntry(j *job, e *schemas.Parked) (*kgo.Record, error) {
	p := j.rec.Partition
	var err error
	for range parkEntryTries {
		var r *kgo.Record
		if r, err = rn.parkWrite(p, rn.parkRecord(rn.parkedPart(p), j.id, e)); err == nil || ended(err) {
			return r, err
		}
		rn.log.Warn("parked entry not written: trying again", "report_id", j.id, "partition", p, "err", err)
	}
	return nil, err
}

// asParked turns rec, the Delivery record of a retry answer, into the
// parked record of the same answer: outcome parked, source flags "fp"
// (settled: recovery never posts the offset again from <prefix>.reports).
func asParked(rec *kgo.Record) {
	var del schemas.Delivery
	if err := json.Unmarshal(rec.Value, &del); err == nil {
		del.Outcome = schemas.OutcomeParked
		rec.Value = schemas.AppendDelivery(nil, &del)
	}
	for i, h := range rec.Headers {
		if h.Key != schemas.HeaderSource {
			continue
		}
		p, o, _, ok := parseSource(h.Value)
		if ok {
			rec.Headers[i].Value = fmt.Appendf(nil, "%d:%d:fp", p, o)
		}
	}
}

// parked applies the acknowledgement of j's parked record (a produce
// callback; no lock held): the offset is settled, like a final one, and the
// report goes to the slow lane (its entry e at offset off).
func (rn *run) parked(j *job, r *kgo.Record, e *schemas.Parked, off int64) {
	ps := j.ps
	var rq []*job
	ps.mu.Lock()
	ps.noteLog(r)
	ps.inflight--
	j.unacked--
	delete(ps.unsure, j) // its doubt, if any, is in the entry now
	ps.dirty = true
	dropped := ps.dropped.Load()
	rq = rn.markDone(ps, j.seq, rq)
	ps.mu.Unlock()
	rn.met.parkedReport(context.Background())
	why := "retry budget spent"
	switch {
	case j.unposted && e.Attempts == 0:
		why = "its track hangs: its reports spent the track's retry budget; not posted"
	case j.unposted:
		why = "its track hangs: its reports spent the track's retry budget; parked without another post"
	case j.pressured:
		why = "its partition is full behind it (max pending or the progress window)"
	case j.trackHangs:
		why = "its track hangs: another report of it spent its retry budget"
	}
	rn.log.Warn("report parked: set aside for slow retries, its partition goes on", "why", why,
		"report_id", j.id, "track_id", trackKey(j.body), "status", e.Status, "reason", e.Reason, "message", e.Message,
		"attempts", e.Attempts, "in_doubt", e.InDoubt, "partition", j.rec.Partition, "offset", j.rec.Offset,
		"next_retry", time.UnixMilli(e.Due).UTC())
	rn.idMu.Lock()
	if rn.active[j.id] == j {
		delete(rn.active, j.id)
	}
	followers := j.followers
	j.followers = nil
	if !dropped {
		rn.recent.add(j.id) // twins are the parked report's to deliver
	}
	rn.idMu.Unlock()
	if !dropped {
		for _, f := range followers {
			if !f.ps.dropped.Load() {
				rn.met.skip(context.Background(), "duplicate")
				rq = rn.finalWithoutPost(f, rq)
			}
		}
		rn.slow.addItem(newParkedItem(ps, e, rn.parkedPart(j.rec.Partition), off))
	}
	rn.requeue(rq)
	if rn.revoking.Load() > 0 {
		rn.poke()
	}
}
