package reporter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// next takes the next leased report to post (mu held), or nil while there
// is none or a standby episode or a shutdown holds posting. The report goes
// in flight in its partition's unsure set, under the partition's lock: a
// revocation that began first keeps it from being posted, and a commit that
// comes after carries it.
func (rn *run) next() *job {
	// Posts on the wire and answers on their way to Kafka are capped
	// together: a crash re-posts at most 2 × the limit (at least
	// Concurrency) reports (docs/reporter.md). One cap for both, not the
	// limit each, so that answers waiting for a slow acknowledgement use the
	// room of posts not in flight instead of holding workers while less is
	// at stake.
	for !rn.stopping.Load() && rn.standby == nil && rn.leased.len() > 0 && rn.roomAtStake() && rn.thr.allows(rn.inflight) {
		j := rn.leased.pop()
		if rn.leased.len() < rn.cfg.Concurrency || rn.leaseDue() {
			rn.jobsReady()
		}
		ps := j.ps
		ps.mu.Lock()
		if ps.revoking.Load() || ps.dropped.Load() {
			rn.unlease(j)
			ps.mu.Unlock()
			rn.freeRetrySlot(j)
			rn.idMu.Lock()
			if rn.active[j.id] == j {
				rn.release(j)
			}
			rn.idMu.Unlock()
			continue
		}
		if rn.hangs(j) {
			// Its track hangs (leased before the track's budget was
			// spent): parked without a post (parkhang.go).
			rn.unlease(j)
			ps.mu.Unlock()
			rn.freeRetrySlot(j)
			rn.queuePark(j)
			continue
		}
		j.leasedOnly = false
		ps.inflight++
		j.unacked++
		ps.unsure[j] = struct{}{}
		ps.dirty = true
		ps.mu.Unlock()
		j.gen = rn.gen
		j.postNo = rn.thr.lim.started(rn.cfg.Now(), j.retrySlot, j.suspectSlot, j.track)
		rn.inflight++
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
	var final bool // last's answer is final: read while the worker owned last
	var parking bool
	for {
		rn.mu.Lock()
		if last != nil {
			rn.inflight--
			rn.thr.lim.finished(last.postNo)
			rn.freeRetrySlot(last)
			rn.posted(last)
			parking = last.parking // set by posted: its budget is spent (park.go)
			if rec != nil {
				rn.publishing.Add(1) // before inflight can be seen at 0: finish waits for it
				rn.unrecorded++
			}
		}
		j := rn.next()
		rn.mu.Unlock()
		if rec != nil {
			if parking {
				rn.park(last, rec) // never queued again: the worker still owns it
			} else {
				rn.publish(last, rec, final)
			}
			rn.publishing.Done()
		}
		last, rec = nil, nil
		if j == nil {
			rn.mu.Lock()
			for j = rn.next(); j == nil && !rn.exiting; j = rn.next() {
				// Whoever wakes this worker counts it out of idle
				// (wakeWorkers): a wake-up is one report to take, not a
				// stampede of every idle worker.
				rn.idle++
				rn.cond.Wait()
			}
			rn.mu.Unlock()
			if j == nil {
				return
			}
		}
		last, rec = j, rn.post(j)
		final = j.dec.Action.Final()
	}
}

// publish sends the Delivery record of j's last answer (final: the answer
// is final). A final answer's offset may be committed only once its record
// is in Kafka: the ledger never misses the outcome of a committed report.
// It reads nothing of j: posted handed j back, and a retry's post by
// another worker may write its decision already.
func (rn *run) publish(j *job, rec *kgo.Record, final bool) {
	if final {
		rn.produce(rec, func(r *kgo.Record, err error) {
			rn.recorded()
			rn.persisted(j, r, err)
		})
		return
	}
	rn.produce(rec, func(r *kgo.Record, err error) {
		rn.recorded()
		ps := j.ps
		ps.mu.Lock()
		if err != nil {
			j.inDoubt = true // the answer is not on record
		} else {
			ps.noteLog(r)
		}
		rn.answerAcked(j)
		ps.mu.Unlock()
		if err != nil && !errors.Is(err, kgo.ErrClientClosed) {
			rn.stop(fmt.Errorf("reporter: publish delivery record: %w", err), false)
		}
	})
}

// atStake is the number of posts whose answer is not in Kafka yet: posts in
// flight and answers handed to Kafka, not acknowledged (mu held). A crash
// re-posts these.
func (rn *run) atStake() int { return rn.inflight + rn.unrecorded }

// stakeCap is the cap on posts at stake: twice the in-flight limit, at
// least twice Concurrency (mu held).
func (rn *run) stakeCap() int { return 2 * max(int(rn.thr.lim.limit), rn.cfg.Concurrency) }

// roomAtStake reports whether one more post stays within stakeCap, the
// stalled posts not counted (limiter.stalledOut: they hang on their
// payload, a crash re-posts them on top) (mu held).
func (rn *run) roomAtStake() bool { return rn.atStake()-rn.thr.lim.stalledOut() < rn.stakeCap() }

// wakeWorkers wakes as many idle workers as there are leased reports they
// may post now (mu held). Each woken worker is counted out of idle here, so
// that wake-ups arriving before it runs do not wake it twice.
func (rn *run) wakeWorkers() {
	if rn.idle == 0 || rn.leased.len() == 0 || rn.stopping.Load() || rn.standby != nil {
		return
	}
	n := min(rn.idle, rn.leased.len(), rn.thr.lim.room(rn.inflight), rn.stakeCap()-rn.atStake()+rn.thr.lim.stalledOut())
	for range n {
		rn.idle--
		rn.cond.Signal()
	}
}

// recorded: one answer handed to Kafka by a worker is acknowledged (or
// failed); a worker held by the cap on posts at stake may go. Each
// acknowledgement wakes one: those of one produce request come one after
// the other, and each makes room for one post.
func (rn *run) recorded() {
	rn.mu.Lock()
	rn.unrecorded--
	rn.wakeWorkers()
	rn.mu.Unlock()
}

// post runs in a worker, outside the lock: one POST, classified. It returns
// the Delivery record to publish (nil for an abandoned post).
func (rn *run) post(j *job) *kgo.Record {
	var waited time.Duration
	if rn.limiter != nil {
		var err error
		if waited, err = rn.waitRate(); err != nil {
			j.dec = delivery.Decision{Action: delivery.ActAbandon, Err: err} // nothing sent: no doubt
			return nil
		}
	}
	j.attempt++
	// A consumer span per attempt ("process <topic>", messaging semantic
	// conventions) continues the trace the record carries (or starts one);
	// the delivery span and the partner API's HTTP span are inside it.
	ctx, proc, span := rn.startSpans(j)
	defer proc.End()
	// A post's latency is a real-time measurement on purpose (the partner
	// client's own, or this fallback), not the injected clock (clock.go).
	start := time.Now()
	res, err := rn.api.ReportPlayJSON(ctx, j.body)
	lat := res.Latency
	if lat <= 0 {
		lat = time.Since(start)
	}
	d := delivery.Classify(res, err, !rn.cfg.LiveBypassNotDelivered)
	if d.Doubt != "" {
		// The request may have left and no complete answer of the API came
		// back (Decision.Doubt): the partner may have recorded the report.
		// Every later post is labelled, and this attempt's record (or, for
		// an abandoned post, the next one) carries the cause. Under the
		// partition's lock: an earlier attempt's record acknowledged (or
		// failed: publish) now reads or writes it.
		j.ps.mu.Lock()
		j.inDoubt = true
		j.ps.mu.Unlock()
	}
	if span.IsRecording() {
		j.ps.mu.Lock() // the doubt is the partition's (see above)
		inDoubt := j.inDoubt
		j.ps.mu.Unlock()
		span.SetAttributes(
			attribute.String("playpipe.report_id", j.id),
			attribute.Int("playpipe.delivery.attempt", j.attempt),
			attribute.Bool("playpipe.delivery.replay", j.replay),
			attribute.Bool("playpipe.delivery.in_doubt", inDoubt),
			attribute.Int("http.response.status_code", d.Status),
			attribute.String("playpipe.served_by", string(d.ServedBy)),
			attribute.String("playpipe.delivery.outcome", d.Outcome),
		)
		if d.Reason != "" {
			span.SetAttributes(attribute.String("playpipe.delivery.retry_reason", d.Reason))
		}
		if d.Err != nil && d.Action != delivery.ActRejected {
			span.SetStatus(codes.Error, d.Action.String())
			span.RecordError(d.Err)
		}
	}
	span.End()
	j.dec, j.latency, j.held = d, lat, lat+waited
	if sc := span.SpanContext(); sc.HasTraceID() {
		j.traceID = sc.TraceID().String()
	}
	if d.Action == delivery.ActAbandon {
		return nil
	}
	rn.met.record(ctx, d, lat.Seconds())
	return rn.deliveryRecord(ctx, j)
}

// startSpans starts the attempt's consumer span and its delivery span in
// the trace j's record carries. With tracing off (a no-op tracer) both are
// the record's remote span, started for nothing: the trace context still
// reaches the partner API's request, without two contexts made per post.
func (rn *run) startSpans(j *job) (ctx context.Context, proc, span trace.Span) {
	base := rn.postCtx
	if j.ctx != nil {
		base = j.ctx
	}
	ctx = telemetry.Extract(base, j.rec)
	if !rn.met.tracing {
		span = trace.SpanFromContext(ctx)
		return ctx, span, span
	}
	ctx, proc = rn.met.tracer.Start(ctx, rn.processSpan, consumerSpan...)
	if proc.IsRecording() {
		proc.SetAttributes(attribute.String("messaging.system", "kafka"), attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", j.rec.Topic), attribute.Int("messaging.destination.partition.id", int(j.rec.Partition)),
			attribute.Int64("messaging.kafka.offset", j.rec.Offset), attribute.String("messaging.kafka.message.key", j.id))
	}
	ctx, span = rn.met.tracer.Start(ctx, "playpipe.report.deliver")
	return ctx, proc, span
}

// consumerSpan is the option of the per-attempt consumer span, made once
// (a variadic option built per call allocates on the hot path).
var consumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// deliveryRecord builds the <prefix>.deliveries record of j's last answer,
// in the deliveries partition of its report's partition, with the report's
// location and what the answer means for it in the HeaderSource header. It
// reads fields the worker owns while posting, and the doubt under the
// partition's lock (an earlier attempt's record may fail meanwhile).
func (rn *run) deliveryRecord(ctx context.Context, j *job) *kgo.Record {
	d := j.dec
	j.ps.mu.Lock()
	inDoubt := j.inDoubt
	j.ps.mu.Unlock()
	// An earlier attempt that left no record of its own (abandoned in
	// flight, or the previous owner's crash): this record counts it.
	doubt := delivery.Doubt{InDoubt: inDoubt, Carried: j.carried}
	del := delivery.New(&delivery.Attempt{ReportID: j.id, EventID: j.evID, N: j.attempt, Decision: d, Latency: j.latency,
		TraceID: j.traceID, Partner: rn.cfg.PartnerURL, Replay: j.replay, At: rn.cfg.Now()}, &doubt)
	if q := j.redrive; q != nil {
		del.ReplayID, del.ReplayReason = q.ReplayID, q.Reason // an operator's redrive, posted by the slow lane
	}
	j.carried = doubt.Carried
	// One allocation for the record, its header, and the key, the source
	// header and the value (the hot path's allocations); a longer value
	// than the room left takes one more.
	rh := &deliveryAlloc{}
	buf := rh.buf[:0]
	if n := len(j.id) + 24 + 320; n > deliveryRoom {
		buf = make([]byte, 0, n) // a long report id: the source header must fit after it
	}
	buf = append(buf, j.id...)
	key := buf[:len(j.id):len(j.id)]
	src := buf[len(buf):]
	src = strconv.AppendInt(src, int64(j.rec.Partition), 10)
	src = append(src, ':')
	src = strconv.AppendInt(src, j.rec.Offset, 10)
	src = append(src, ':')
	switch {
	case d.Action.Final():
		src = append(src, 'f')
	case inDoubt:
		src = append(src, 'd')
	default:
		src = append(src, '-')
	}
	src = src[:len(src):len(src)]
	rh.hdr[0] = kgo.RecordHeader{Key: schemas.HeaderSource, Value: src}
	rh.rec = kgo.Record{Key: key, Value: schemas.AppendDelivery(buf[len(buf)+len(src):len(buf)+len(src)], &del), Partition: j.ps.logPart, Headers: rh.hdr[:1:1]}
	telemetry.Inject(ctx, &rh.rec)
	return &rh.rec
}

// recordWithHeader is a record and room for its one header, allocated together.
type recordWithHeader struct {
	rec kgo.Record
	hdr [1]kgo.RecordHeader
}

// deliveryRoom is the room for a Delivery record's key, source header and
// JSON value kept next to the record: ~250 bytes of JSON, a report id and a
// trace id fit.
const deliveryRoom = 400

// deliveryAlloc is a Delivery record with its header and the room for its
// bytes: one allocation per answer instead of two (BenchmarkOverhead).
type deliveryAlloc struct {
	recordWithHeader
	buf [deliveryRoom]byte
}
