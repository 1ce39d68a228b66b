package reporter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/schemas"
)

// A report is posted only after a lease marker naming its offset is in the
// deliveries log (acknowledged): after a crash, the log says which reports
// may have reached the partner without a recorded answer (recover.go). The
// leaser keeps up to leaseAhead × Concurrency reports leased ahead of the
// workers, one marker per partition per lease, so that the markers' round
// trip overlaps the posts instead of adding to them.

// leaseAhead × Concurrency reports at most are leased and not yet posted:
// enough to cover a marker's round trip at full speed. They are the
// over-count of "in doubt" after a crash (never of real duplicates).
const leaseAhead = 2

// lease is a batch of reports whose markers are on their way to Kafka.
type lease struct {
	jobs    []*job
	markers int // markers not acknowledged yet
}

// leaser leases queued reports until the run ends.
func (rn *run) leaser() {
	for {
		select {
		case <-rn.leaseWake:
		case <-rn.coordDone:
			return
		}
		for {
			rn.mu.Lock()
			l, recs := rn.takeLease()
			rn.mu.Unlock()
			if l == nil {
				break
			}
			for _, rec := range recs {
				rn.cl.Produce(context.Background(), rec, func(r *kgo.Record, err error) { rn.leaseAcked(l, r, err) })
			}
		}
	}
}

// takeLease moves up to the lease room's worth of queued reports into a
// new lease and returns it with its marker records (mu held); nil when
// there is nothing to lease or no room.
func (rn *run) takeLease() (*lease, []*kgo.Record) {
	if rn.stopping || rn.exiting || rn.standby != nil {
		return nil, nil
	}
	room := leaseAhead*rn.cfg.Concurrency - rn.leased.len() - rn.leasing
	if room <= 0 {
		return nil, nil
	}
	l := &lease{}
	byPart := map[*partState]*schemas.Lease{}
	var order []*partState
	for range room {
		j := rn.take()
		if j == nil {
			break
		}
		l.jobs = append(l.jobs, j)
		j.leasedOnly = true
		j.ps.unsure[j] = struct{}{}
		j.ps.dirty = true
		m := byPart[j.ps]
		if m == nil {
			m = &schemas.Lease{V: 1, Partition: j.ps.key.partition}
			byPart[j.ps] = m
			order = append(order, j.ps)
		}
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
	recs := make([]*kgo.Record, 0, len(order))
	group := []byte(rn.cfg.Group)
	for _, ps := range order {
		recs = append(recs, &kgo.Record{
			Partition: ps.logPart,
			Headers:   []kgo.RecordHeader{{Key: schemas.HeaderLease, Value: group}},
			Value:     appendLease(nil, byPart[ps]),
		})
	}
	l.markers = len(recs)
	return l, recs
}

// leaseAcked applies the acknowledgement of one lease marker; once all of a
// lease's markers are in, its reports may be posted.
func (rn *run) leaseAcked(l *lease, r *kgo.Record, err error) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if err != nil {
		if !errors.Is(err, kgo.ErrClientClosed) {
			rn.stop(fmt.Errorf("reporter: publish lease marker: %w", err), false)
		}
	} else {
		rn.noteLog(r)
	}
	if l.markers--; l.markers > 0 {
		return
	}
	rn.leasing -= len(l.jobs)
	for _, j := range l.jobs {
		rn.leased.push(j)
	}
	rn.jobsReady()
}

// noteLog records that r, produced by this run, is acknowledged (mu held).
func (rn *run) noteLog(r *kgo.Record) {
	if r.Offset+1 > rn.logEnd[r.Partition] {
		rn.logEnd[r.Partition] = r.Offset + 1
	}
}

// take pops the next report to lease (mu held): retries and replays first.
// Reports already final (re-published events) are passed; a report whose
// twin is on its way waits for the twin's outcome.
func (rn *run) take() *job {
	for {
		j := rn.ready.pop()
		if j == nil {
			if j = rn.fresh.pop(); j == nil {
				return nil
			}
		}
		if j.ps.revoking || j.ps.dropped {
			continue
		}
		if rn.recent.has(j.id) && rn.active[j.id] != j {
			// Already delivered or rejected within the window (re-published
			// event): final without a post.
			rn.met.skip(context.Background(), "duplicate")
			rn.log.Debug("skipping report already final", "report_id", j.id)
			rn.finalWithoutPost(j)
			continue
		}
		if a := rn.active[j.id]; a != nil && a != j {
			// The same report is on its way: wait for its outcome.
			a.followers = append(a.followers, j)
			continue
		}
		rn.active[j.id] = j
		return j
	}
}

// finalWithoutPost marks a job final that needs no post (mu held).
func (rn *run) finalWithoutPost(j *job) {
	delete(j.ps.unsure, j)
	j.ps.dirty = true
	rn.markDone(j.ps, j.seq)
}

// next takes the next leased report to post (mu held), or nil while there
// is none or a standby episode or a shutdown holds posting.
func (rn *run) next() *job {
	// Answers on their way to Kafka are capped like posts on the wire: a
	// crash re-posts at most 2 × Concurrency reports (docs/reporter.md).
	for !rn.stopping && rn.standby == nil && rn.leased.len() > 0 && rn.unrecorded < rn.cfg.Concurrency && rn.thr.allows(rn.inflight, time.Now()) {
		j := rn.leased.pop()
		if rn.leased.len() < rn.cfg.Concurrency {
			rn.jobsReady()
		}
		if j.ps.revoking || j.ps.dropped {
			rn.unlease(j)
			if rn.active[j.id] == j {
				rn.release(j)
			}
			continue
		}
		j.leasedOnly = false
		j.gen = rn.gen
		rn.inflight++
		j.ps.inflight++
		j.unacked++
		j.ps.unsure[j] = struct{}{}
		j.ps.dirty = true
		return j
	}
	return nil
}

// worker posts reports one at a time: it applies the answer to the state
// and takes the next report under one lock, then publishes the answer's
// Delivery record and posts the next report outside it.
func (rn *run) worker() {
	var last *job
	var rec *kgo.Record
	for {
		rn.mu.Lock()
		if last != nil {
			rn.inflight--
			rn.posted(last)
			if rec != nil {
				rn.publishing.Add(1) // before inflight can be seen at 0: finish waits for it
				rn.unrecorded++
			}
		}
		j := rn.next()
		rn.mu.Unlock()
		if rec != nil {
			rn.publish(last, rec)
			rn.publishing.Done()
		}
		last, rec = nil, nil
		if j == nil {
			rn.mu.Lock()
			for j = rn.next(); j == nil && !rn.exiting; j = rn.next() {
				rn.idle++
				rn.cond.Wait()
				rn.idle--
			}
			rn.mu.Unlock()
			if j == nil {
				return
			}
		}
		last, rec = j, rn.post(j)
	}
}

// publish sends the Delivery record of j's last answer. A final answer's
// offset may be committed only once its record is in Kafka: the ledger
// never misses the outcome of a committed report.
func (rn *run) publish(j *job, rec *kgo.Record) {
	if j.dec.Action.Final() {
		rn.cl.Produce(context.Background(), rec, func(r *kgo.Record, err error) {
			rn.mu.Lock()
			rn.recorded()
			rn.persisted(j, r, err)
			if len(rn.revocations) > 0 {
				rn.poke()
			}
			rn.mu.Unlock()
		})
		return
	}
	rn.cl.Produce(context.Background(), rec, func(r *kgo.Record, err error) {
		rn.mu.Lock()
		defer rn.mu.Unlock()
		rn.recorded()
		if err != nil {
			j.inDoubt = true // the answer is not on record
			if !errors.Is(err, kgo.ErrClientClosed) {
				rn.stop(fmt.Errorf("reporter: publish delivery record: %w", err), false)
			}
		} else {
			rn.noteLog(r)
		}
		rn.answerAcked(j)
	})
}

// unlease gives up j's lease without posting it (mu held): it is no longer
// unsure unless something else makes it so.
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
		rn.unlease(j)
	}
}

// recorded: one answer handed to Kafka by a worker is acknowledged (or
// failed) (mu held); a worker held by the cap on answers in transit may go.
func (rn *run) recorded() {
	rn.unrecorded--
	if rn.unrecorded == rn.cfg.Concurrency-1 && rn.idle > 0 && rn.leased.len() > 0 {
		rn.cond.Signal()
	}
}

// answerAcked: the answer of one post of j is on record (or will never be,
// and j is in doubt) (mu held).
func (rn *run) answerAcked(j *job) {
	j.unacked--
	if j.unacked <= 0 && !j.inDoubt && !j.leasedOnly {
		delete(j.ps.unsure, j)
	}
	j.ps.dirty = true
}

func (rn *run) persistedLocked(j *job, r *kgo.Record, err error) {
	rn.mu.Lock()
	rn.persisted(j, r, err)
	if len(rn.revocations) > 0 {
		rn.poke()
	}
	rn.mu.Unlock()
}

// post runs in a worker, outside the lock: one POST, classified. It returns
// the Delivery record to publish (nil for an abandoned post).
func (rn *run) post(j *job) *kgo.Record {
	if rn.limiter != nil {
		if err := rn.limiter.Wait(rn.postCtx); err != nil {
			j.dec = Decision{Action: ActAbandon, Err: err, notSent: true}
			return nil
		}
	}
	j.attempt++
	// A consumer span per attempt ("process <topic>", messaging semantic
	// conventions) continues the trace the record carries (or starts one);
	// the delivery span and the partner API's HTTP span are inside it.
	ctx, proc := tracer.Start(telemetry.Extract(rn.postCtx, j.rec), "process "+j.rec.Topic, trace.WithSpanKind(trace.SpanKindConsumer))
	defer proc.End()
	if proc.IsRecording() {
		proc.SetAttributes(attribute.String("messaging.system", "kafka"), attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", j.rec.Topic), attribute.Int("messaging.destination.partition.id", int(j.rec.Partition)),
			attribute.Int64("messaging.kafka.offset", j.rec.Offset), attribute.String("messaging.kafka.message.key", j.id))
	}
	ctx, span := tracer.Start(ctx, "playpipe.report.deliver")
	start := time.Now()
	res, err := rn.api.ReportPlayJSON(ctx, j.body)
	lat := res.Latency
	if lat <= 0 {
		lat = time.Since(start)
	}
	d := Classify(res, err, !rn.cfg.LiveBypassNotDelivered)
	if d.Action == ActRetry && d.Status == 0 && !neverSent(err) {
		// No answer (timeout, connection lost): the partner may have
		// recorded the report. The retry is labelled.
		j.inDoubt = true
	}
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("playpipe.report_id", j.id),
			attribute.Int("playpipe.delivery.attempt", j.attempt),
			attribute.Bool("playpipe.delivery.replay", j.replay),
			attribute.Bool("playpipe.delivery.in_doubt", j.inDoubt),
			attribute.Int("http.response.status_code", d.Status),
			attribute.String("playpipe.served_by", string(d.ServedBy)),
			attribute.String("playpipe.delivery.outcome", d.Outcome),
		)
		if d.Reason != "" {
			span.SetAttributes(attribute.String("playpipe.delivery.retry_reason", d.Reason))
		}
		if d.Err != nil && d.Action != ActRejected {
			span.SetStatus(codes.Error, d.Action.String())
			span.RecordError(d.Err)
		}
	}
	span.End()
	j.dec, j.latency = d, lat
	if sc := span.SpanContext(); sc.HasTraceID() {
		j.traceID = sc.TraceID().String()
	}
	if d.Action == ActAbandon {
		return nil
	}
	rn.met.record(ctx, d, lat.Seconds())
	return rn.deliveryRecord(ctx, j)
}

// neverSent reports whether a transport error proves the request never left
// (the connection could not be made).
func neverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// deliveryRecord builds the <prefix>.deliveries record of j's last answer,
// in the deliveries partition of its report's partition, with the report's
// location and what the answer means for it in the HeaderSource header. It
// reads only fields the worker owns while posting.
func (rn *run) deliveryRecord(ctx context.Context, j *job) *kgo.Record {
	d := j.dec
	del := schemas.Delivery{
		V: schemas.DeliveryVersion, ReportID: j.id, EventID: j.evID, Outcome: d.Outcome, Attempt: j.attempt,
		HTTPStatus: d.Status, ServedBy: string(d.ServedBy), Partner: rn.cfg.PartnerURL, Message: d.Message, Fields: d.Fields,
		Reason: d.Reason, LatencyUS: j.latency.Microseconds(), TraceID: j.traceID, Replay: j.replay,
		InDoubt: j.inDoubt, At: time.Now().UnixMilli(),
	}
	if del.Message == "" && d.Err != nil && d.Action != ActDelivered {
		del.Message = d.Err.Error()
	}
	src := make([]byte, 0, 24)
	src = strconv.AppendInt(src, int64(j.rec.Partition), 10)
	src = append(src, ':')
	src = strconv.AppendInt(src, j.rec.Offset, 10)
	src = append(src, ':')
	switch {
	case d.Action.Final():
		src = append(src, 'f')
	case j.inDoubt:
		src = append(src, 'd')
	default:
		src = append(src, '-')
	}
	rec := &kgo.Record{
		Key: []byte(j.id), Value: schemas.AppendDelivery(make([]byte, 0, 256), &del), Partition: j.ps.logPart,
		Headers: []kgo.RecordHeader{{Key: schemas.HeaderSource, Value: src}},
	}
	telemetry.Inject(ctx, rec)
	return rec
}

// posted applies the answer of j's post to the state (mu held).
func (rn *run) posted(j *job) {
	ps, d := j.ps, j.dec
	if d.Action.Final() {
		rn.healthy()
		rn.persisting++
		rn.recent.add(j.id)
		if d.Action == ActRejected {
			rn.log.Warn("report rejected by the partner API", "report_id", j.id, "status", d.Status, "message", d.Message, "fields", d.Fields)
		}
		if rn.stopping {
			rn.poke()
		}
		return // ps.inflight drops when the Delivery record is persisted
	}
	ps.inflight--
	switch {
	case d.Action == ActRetry && d.Reason != ReasonUnauthorized:
		rn.thr.failure(time.Now())
		if rn.thr.tokens < 1 {
			rn.poke() // the coordinator wakes the workers when a token is back
		}
	case d.Action == ActStandby:
	default:
		rn.healthy()
	}
	if d.Action == ActAbandon {
		// Cancelled while in flight: it may have reached the partner, and
		// no answer will be recorded.
		if !d.notSent {
			j.inDoubt = true
		}
		rn.answerAcked(j)
	}
	if ps.dropped || ps.revoking {
		rn.release(j)
		return
	}
	switch d.Action {
	case ActStandby:
		rn.standbyAnswer(j)
	case ActRetry:
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
			delay = rn.backoff.Delay(j.failures, d.RetryAfter)
		}
		rn.log.Debug("report post to be retried", "report_id", j.id, "attempt", j.attempt, "reason", d.Reason, "status", d.Status, "delay", delay)
		if delay <= 0 {
			rn.ready.push(j)
			rn.jobsReady()
		} else {
			j.readyAt = time.Now().Add(delay)
			rn.delayed.add(j)
			if rn.retryAt.IsZero() || j.readyAt.Before(rn.retryAt) {
				rn.poke() // the retry timer must fire earlier
			}
		}
	case ActStop:
		rn.release(j)
		rn.stop(rn.configError(j, d), true)
	case ActAbandon:
		rn.release(j)
		if !rn.stopping {
			// Cancelled without a shutdown (cannot happen today): post again.
			rn.active[j.id] = j
			rn.ready.push(j)
			rn.jobsReady()
		}
	}
	if rn.stopping || len(rn.revocations) > 0 {
		rn.poke()
	}
}

// healthy records an answer of a healthy partner (mu held); a grown limit
// wakes a waiting worker.
func (rn *run) healthy() {
	before := math.Floor(rn.thr.limit)
	rn.thr.success()
	if math.Floor(rn.thr.limit) > before && rn.idle > 0 && rn.leased.len() > 0 {
		rn.cond.Signal()
	}
}

// release forgets that j is on its way (not final), requeueing followers
// whose partition is still ours.
func (rn *run) release(j *job) {
	if rn.active[j.id] == j {
		delete(rn.active, j.id)
	}
	for _, f := range j.followers {
		if !f.ps.dropped && !f.ps.revoking && f.ps != j.ps {
			rn.ready.push(f)
		}
	}
	j.followers = nil
	rn.jobsReady()
}

// persisted applies the acknowledgement of a final Delivery record (mu held).
func (rn *run) persisted(j *job, r *kgo.Record, err error) {
	rn.persisting--
	if err != nil {
		rn.stop(fmt.Errorf("reporter: publish delivery record of report %s: %w", j.id, err), false)
		return
	}
	rn.noteLog(r)
	j.ps.inflight--
	if rn.active[j.id] == j {
		delete(rn.active, j.id)
	}
	delete(j.ps.unsure, j)
	j.ps.dirty = true
	if j.ps.dropped {
		return
	}
	rn.markDone(j.ps, j.seq)
	for _, f := range j.followers {
		if !f.ps.dropped {
			rn.met.skip(context.Background(), "duplicate")
			rn.finalWithoutPost(f)
		}
	}
	j.followers = nil
}

// markDone records a final outcome in the partition's tracker.
func (rn *run) markDone(ps *partState, seq uint64) {
	ps.dirty = true
	if n := ps.wm.markDone(seq); n > 0 {
		if rn.pending.Add(-int64(n)) < int64(rn.cfg.MaxPending) {
			select {
			case rn.room <- struct{}{}:
			default:
			}
		}
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
