package reporter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// A report is posted only after a lease marker naming its offset is in the
// deliveries log (acknowledged): after a crash, the log says which reports
// may have reached the partner without a recorded answer (recover.go). The
// leaser keeps up to leaseAhead × Concurrency reports leased ahead of the
// workers, one marker per partition per lease, so that the markers' round
// trip overlaps the posts instead of adding to them.
//
// A partition leases only within its progress window (progressWindow of
// MetadataMaxBytes) past its commit point: what the commit metadata can
// hold. A report past it waits in its partition's pastWindow queue until the
// commit point moves, so the progress of every partition always fits,
// whatever the in-flight.

// leaseAhead × Concurrency reports, plus a quarter of the in-flight limit,
// at least may be leased and not yet posted (baseLeaseRoom); toward a partner
// far away that covers a marker's round trip, a small share of a post's.
// Toward a partner that answers faster than the broker acknowledges a
// marker, the posts made during one marker's round trip are more than
// that: the room grows by the limit × marker round trip / post round trip
// (run.leaseRoom), at most maxLeaseExtra × the limit. Leased reports are
// the over-count of "in doubt" after a crash (never of real duplicates).
const (
	leaseAhead    = 2
	maxLeaseExtra = 4
)

// baseLeaseRoom is how many reports may be leased ahead of the workers
// with the in-flight limit at limit, before the marker's round trip is
// known.
func baseLeaseRoom(concurrency, limit int) int { return leaseAhead*concurrency + limit/4 }

// leaseRoom is how many reports may be leased ahead of the workers now
// (mu held): baseLeaseRoom's, plus the posts the limit allows during a
// marker's round trip when the posts' round trip is shorter — at 0 ms
// toward the partner on Apache Kafka, markers acknowledged in 3–5 ms kept
// the leases behind the workers (the e2e bench: nothing leased and workers
// idle in 69 % of its scrapes, with 64 000 reports waiting for a lease).
func (rn *run) leaseRoom(limit int) int {
	room := baseLeaseRoom(rn.cfg.Concurrency, limit)
	post := rn.thr.lim.recent
	if rn.markerRTT <= 0 || post <= 0 {
		return room
	}
	extra := int(int64(limit) * int64(rn.markerRTT) / int64(post))
	return room + min(extra, maxLeaseExtra*limit)
}

// freeLeaseRoom is the room left for a new lease (mu held), and whether
// it is at least a leaseChunk: the least a new lease waits for.
func (rn *run) freeLeaseRoom() (int, bool) {
	limit := int(rn.thr.lim.limit)
	room := rn.leaseRoom(limit) - rn.leased.len() - rn.leasing
	return room, room >= leaseChunk(rn.cfg.Concurrency, limit)
}

// leaseDue reports whether a new lease has room now (mu held): the
// leaser is worth waking.
func (rn *run) leaseDue() bool {
	_, ok := rn.freeLeaseRoom()
	return ok
}

// noteMarkerRTT folds one lease's marker round trip d into markerRTT (mu
// held): a moving mean over about eight leases.
func (rn *run) noteMarkerRTT(d time.Duration) {
	if rn.markerRTT == 0 {
		rn.markerRTT = d
		return
	}
	rn.markerRTT += (d - rn.markerRTT) / 8
}

// leaseChunk is the least room a new lease waits for: a quarter of the
// lease room (half of Concurrency at the starting limit). A freed slot does
// not make a lease of its own; one marker covers many reports
// (bench-report, 100 000 reports at --concurrency 32: ~4 200 markers, where
// a lease per freed slot wrote ~39 000, one record per 2–3 reports for the
// broker to take and acknowledge). Several leases may be on their way at
// once: the next is taken while the previous marker travels.
func leaseChunk(concurrency, limit int) int { return max(1, baseLeaseRoom(concurrency, limit)/4) }

// lease is a batch of reports whose markers are on their way to Kafka.
type lease struct {
	jobs    []*job
	markers int       // markers not acknowledged yet (run.mu)
	at      time.Time // when its markers were handed to Kafka
}

// leaser leases queued reports until the run ends.
func (rn *run) leaser() {
	for {
		select {
		case <-rn.leaseWake:
		case <-rn.coordDone:
			return
		}
		rn.takeLeases(func(l *lease, marks []partLease) {
			for _, m := range marks {
				ps := m.ps
				rn.produce(m.rec, func(r *kgo.Record, err error) { rn.leaseAcked(l, ps, r, err) })
			}
		})
	}
}

// takeLeases takes leases until there is nothing to lease or no room (mu
// taken for each, not held while fn runs) and hands each, with its
// markers, to fn.
func (rn *run) takeLeases(fn func(*lease, []partLease)) {
	for {
		rn.mu.Lock()
		l, marks := rn.takeLease()
		rn.mu.Unlock()
		if l == nil {
			return
		}
		fn(l, marks)
	}
}

// takeLease moves up to the lease room's worth of queued reports into a
// new lease and returns it with its markers, one per partition (mu held);
// nil when there is nothing to lease or no room. Each report joins its
// partition's unsure set before its marker is produced: a commit in between
// carries it.
func (rn *run) takeLease() (*lease, []partLease) {
	if rn.stopping.Load() || rn.exiting || rn.standby != nil {
		return nil, nil
	}
	room, ok := rn.freeLeaseRoom()
	if !ok {
		return nil, nil
	}
	// Few partitions per lease: a slice, not a map (allocations per lease
	// are allocations per report at full speed).
	l := &lease{jobs: make([]*job, 0, min(room, rn.ready.len()+rn.fresh.len()))}
	var parts []partLease
	for range room {
		j := rn.take()
		if j == nil {
			break
		}
		l.jobs = append(l.jobs, j)
		ps := j.ps
		ps.mu.Lock()
		j.leasedOnly = true
		ps.unsure[j] = struct{}{}
		ps.dirty = true
		ps.mu.Unlock()
		i := 0
		for i < len(parts) && parts[i].ps != ps {
			i++
		}
		if i == len(parts) {
			parts = append(parts, partLease{ps: ps, m: schemas.Lease{V: 1, Partition: ps.key.partition}})
		}
		m := &parts[i].m
		if n := len(m.Offsets); n > 0 && m.Offsets[n-1][1]+1 == j.rec.Offset {
			m.Offsets[n-1][1] = j.rec.Offset
		} else {
			m.Offsets = append(m.Offsets, [2]int64{j.rec.Offset, j.rec.Offset})
		}
	}
	if len(l.jobs) == 0 {
		return nil, nil
	}
	rn.leasing += len(l.jobs)
	l.at = rn.cfg.Now()
	for i := range parts {
		rh := &recordWithHeader{}
		rh.hdr[0] = kgo.RecordHeader{Key: schemas.HeaderLease, Value: rn.groupHdr}
		rh.rec = kgo.Record{Partition: parts[i].ps.logPart, Headers: rh.hdr[:1:1], Value: appendLease(make([]byte, 0, 48+44*len(parts[i].m.Offsets)), &parts[i].m)}
		parts[i].rec = &rh.rec
	}
	l.markers = len(parts)
	return l, parts
}

// partLease is the lease marker of one partition: its offsets, then its
// record.
type partLease struct {
	ps  *partState
	m   schemas.Lease
	rec *kgo.Record
}

// leaseAcked applies the acknowledgement of the lease marker of partition
// ps (no lock held); once all of a lease's markers are in, its reports may
// be posted. The reports are in their partitions' unsure sets already, so
// the log position may move before they become postable.
func (rn *run) leaseAcked(l *lease, ps *partState, r *kgo.Record, err error) {
	if err != nil {
		if !errors.Is(err, kgo.ErrClientClosed) {
			rn.stop(fmt.Errorf("reporter: publish lease marker: %w", err), false)
		}
	} else {
		ps.mu.Lock()
		ps.noteLog(r)
		ps.mu.Unlock()
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if l.markers--; l.markers > 0 {
		return
	}
	if err == nil {
		rn.noteMarkerRTT(rn.cfg.Now().Sub(l.at))
	}
	rn.leasing -= len(l.jobs)
	for _, j := range l.jobs {
		rn.leased.push(j)
	}
	rn.jobsReady()
}

// noteLog records that r, produced by this run for the partition, is
// acknowledged (ps.mu held).
func (ps *partState) noteLog(r *kgo.Record) {
	if r.Offset+1 > ps.logEnd {
		ps.logEnd = r.Offset + 1
	}
}

// take pops the next report to lease (mu held; it takes idMu and the
// report's partition lock in turn): retries and replays first. Reports
// already final (re-published events) are passed; a report whose twin is on
// its way waits for the twin's outcome.
func (rn *run) take() *job {
	for {
		// Retries and fresh reports take turns while both wait, and fresh
		// ones go first while the retry budget is short: retries that keep
		// failing (one bad payload, a stuck partition) never take every post
		// the budget allows, so the reports that would succeed — and refill
		// the budget — keep going.
		//
		// Reports that failed before hold at most retryCap slots (leased or
		// in flight): a retry over it waits at the head of ready, and fresh
		// reports go on. Posts that hang until --api-timeout never hold
		// every slot.
		//
		// Fresh reports of a suspect track (suspect.go) hold at most
		// suspectCap slots: over it, one waits aside, and the next fresh
		// report is taken. The reports aside go first when a slot is free.
		var j *job
		capped := false
		if h := rn.ready.peek(); h != nil && h.failures > 0 && rn.retriesHeld() >= rn.retryCap() {
			capped = true
		}
		switch {
		case rn.aside.len() > 0 && (rn.suspectsHeld() < rn.suspectCap() || !rn.thr.lim.sus.is(rn.aside.peek().track)):
			j = rn.aside.pop()
		case (rn.tookRetry || capped || rn.thr.tokens < rn.thr.max/2) && rn.fresh.len() > 0:
			j = rn.fresh.pop()
			rn.tookRetry = false
		case capped:
			return nil // a retry slot frees when a retry's post is back (freeRetrySlot)
		default:
			if j = rn.ready.pop(); j != nil {
				rn.tookRetry = true
			} else if j = rn.fresh.pop(); j == nil {
				return nil
			}
		}
		// A report of a track that hangs (its reports spent the track's
		// budget) is parked without a post (parkhang.go).
		hangs := rn.hangs(j)
		suspect := !hangs && j.failures == 0 && rn.thr.lim.sus.is(j.track)
		if suspect && rn.suspectsHeld() >= rn.suspectCap() {
			rn.aside.push(j) // a suspect slot frees when one's post is back (freeRetrySlot)
			continue
		}
		if !rn.admit(j) {
			continue
		}
		if hangs {
			rn.queuePark(j)
			continue
		}
		if j.failures > 0 {
			j.retrySlot = true
			rn.retrySlots++
		}
		if j.suspect = suspect; suspect {
			j.suspectSlot = true
			rn.suspectSlots++
		}
		return j
	}
}

// admit runs the checks of a report about to be leased, or parked without
// a post (mu held; it takes the report's partition lock and idMu in turn):
// false when it goes no further — its partition revoked, past its progress
// window (held there until the commit point moves), final without a post
// (below the minimum, or already final within the duplicate window), or
// waiting for a twin on its way. Otherwise it is the active report of its
// id.
func (rn *run) admit(j *job) bool {
	ps := j.ps
	ps.mu.Lock()
	switch {
	case ps.revoking.Load() || ps.dropped.Load():
		ps.mu.Unlock()
		return false
	case !rn.inWindow(j):
		ps.pastWindow.push(j) // back in ready once the commit point moved
		ps.mu.Unlock()
		return false
	case j.skip:
		// Below the minimum play length past the window at intake:
		// final now that the progress can hold it.
		rn.met.skip(context.Background(), "below_minimum")
		rq := rn.markDone(ps, j.seq, nil)
		ps.mu.Unlock()
		rn.pushReady(rq)
		return false
	}
	ps.mu.Unlock()
	rn.idMu.Lock()
	if rn.recent.has(j.id) && rn.active[j.id] != j {
		rn.idMu.Unlock()
		// Already delivered or rejected within the window (re-published
		// event): final without a post.
		rn.met.skip(context.Background(), "duplicate")
		rn.log.Debug("skipping report already final", "report_id", j.id)
		rn.pushReady(rn.finalWithoutPost(j, nil))
		return false
	}
	if a := rn.active[j.id]; a != nil && a != j {
		// The same report is on its way: wait for its outcome.
		a.followers = append(a.followers, j)
		rn.idMu.Unlock()
		return false
	}
	rn.active[j.id] = j
	rn.idMu.Unlock()
	return true
}

// retryShare is the share of the in-flight limit that reports which failed
// before may hold (take): a partner hanging on some payloads until the
// timeout holds at most that share of the posts with their retries.
const retryShare = 0.25

// retryCap is how many reports that failed before may be leased or in
// flight at once (mu held): retryShare of the in-flight limit, at least 1.
func (rn *run) retryCap() int { return max(1, int(rn.thr.lim.limit*retryShare)) }

// retriesHeld is how many of the retries' slots are held (mu held): the
// retries leased or in flight, but those stalled (limiter.stalledOut: a
// retry hanging on its payload holds no slot of the limit, so none of the
// retries' either — it only cost its few round trips).
func (rn *run) retriesHeld() int { return rn.retrySlots - rn.thr.lim.stalledRetriesOut() }

// freeRetrySlot gives back j's retry slot or suspect slot, if it holds
// one, once its post is back or its lease given up (mu held); a retry (or
// a report aside) waiting for one may be leased.
func (rn *run) freeRetrySlot(j *job) {
	if j.suspectSlot {
		j.suspectSlot = false
		rn.suspectSlots--
		if rn.aside.len() > 0 && rn.suspectsHeld() < rn.suspectCap() {
			rn.jobsReady()
		}
	}
	if !j.retrySlot {
		return
	}
	j.retrySlot = false
	rn.retrySlots--
	if h := rn.ready.peek(); h != nil && h.failures > 0 && rn.retriesHeld() < rn.retryCap() {
		rn.jobsReady()
	}
}

// inWindow reports whether j lies within its partition's progress window
// past the commit point (j.ps.mu held): only then may it be leased or made
// final.
func (rn *run) inWindow(j *job) bool {
	return j.rec.Offset < rn.commitBase(j.ps)+rn.window
}

// commitBase is the partition's commit point (ps.mu held): the Base of its
// progress.
func (rn *run) commitBase(ps *partState) int64 {
	if base, _, ok := ps.wm.commitPoint(); ok {
		return base
	}
	return ps.start
}

// unheld appends to rq the reports a partition held back past its window,
// once its commit point moved (ps.mu held); the caller queues them
// (pushReady) once it holds the dispatch lock.
func (ps *partState) unheld(rq []*job) []*job {
	for j := ps.pastWindow.pop(); j != nil; j = ps.pastWindow.pop() {
		rq = append(rq, j)
	}
	return rq
}

// pushReady queues rq for leasing (mu held).
func (rn *run) pushReady(rq []*job) {
	if len(rq) == 0 {
		return
	}
	for _, j := range rq {
		rn.ready.push(j)
	}
	rn.jobsReady()
}

// requeue queues rq for leasing (no lock held).
func (rn *run) requeue(rq []*job) {
	if len(rq) == 0 {
		return
	}
	rn.mu.Lock()
	rn.pushReady(rq)
	rn.mu.Unlock()
}

// unlease gives up j's lease without posting it (j.ps.mu held): it is no
// longer unsure unless something else makes it so.
func (rn *run) unlease(j *job) {
	if !j.leasedOnly {
		return
	}
	j.leasedOnly = false
	if j.unacked <= 0 && !j.inDoubt {
		delete(j.ps.unsure, j)
	}
	j.ps.dirty = true
}

// unleaseAll gives up the leases of the reports not posted (mu held): the
// run stops posting (shutdown) and they will be posted by the next one.
func (rn *run) unleaseAll() {
	for _, j := range rn.leased.all() {
		j.ps.mu.Lock()
		rn.unlease(j)
		j.ps.mu.Unlock()
	}
}

// appendLease appends the JSON of a lease marker (what encoding/json would
// write for it).
func appendLease(dst []byte, l *schemas.Lease) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(l.V), 10)
	dst = append(dst, `,"partition":`...)
	dst = strconv.AppendInt(dst, int64(l.Partition), 10)
	dst = append(dst, `,"offsets":[`...)
	for i, r := range l.Offsets {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '[')
		dst = strconv.AppendInt(dst, r[0], 10)
		dst = append(dst, ',')
		dst = strconv.AppendInt(dst, r[1], 10)
		dst = append(dst, ']')
	}
	return append(dst, "]}"...)
}
