package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/schemas"
)

// processor turns polled event records into output records. It owns the
// per-transaction arenas (records and bytes), reused after each End.
type processor struct {
	cache    *MixCache
	topics   kafkax.Topics
	validate schemas.ValidateOptions
	split    SplitOptions
	conc     int
	maxEvent int // events longer than this are rejected too_large; 0: no limit
	tracer   trace.Tracer
	spanOpts []trace.SpanStartOption

	items []item
	plays []schemas.TrackPlay
	arena [][]kgo.Record // chunks of output records of the open transaction; never reallocated, as the producer holds pointers into them
	used  int
	buf   []byte
	out   []*kgo.Record

	errMu   sync.Mutex
	prodErr error
	refused []*kgo.Record // records Kafka refused for themselves (recordRefused), this transaction

	// Per transaction: the first output record (arena index) of each
	// event, to find the event behind a refused record.
	spans []evSpan
	// Events whose outputs Kafka refused, by source location, across
	// transactions (until one commits past them); bounded by the events
	// of the aborted transactions.
	poison     map[srcLoc]*poisonState
	maxProduce int
	isolate    [][2]int // ranges of p.out (suspects' records) produced between flushes

	pending   Stats // counts of the open transaction
	statsMu   sync.Mutex
	committed Stats

	mEvents, mPlays, mBelow metric.Int64Counter
	mRejected, mNoPlays     metric.Int64Counter
	rejectedByReason        map[string]int64
}

type item struct {
	rec     *kgo.Record
	ev      schemas.PlayerEvent
	vs      []schemas.Violation
	listing *Listing
	fetched bool // the listing was not cached: this batch fetched it
}

func newProcessor(cache *MixCache, topics kafkax.Topics, v schemas.ValidateOptions, split SplitOptions, conc int) *processor {
	if conc <= 0 {
		conc = 8
	}
	return &processor{cache: cache, topics: topics, validate: v, split: split, conc: conc,
		tracer: noop.NewTracerProvider().Tracer(instrumentationName), spanOpts: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}, rejectedByReason: map[string]int64{}}
}

func (p *processor) initMetrics(m metric.Meter) error {
	var errs []error
	var err error
	p.mEvents, err = m.Int64Counter("playpipe.events.in", metric.WithDescription("player events consumed and committed by the enricher"))
	errs = append(errs, err)
	p.mPlays, err = m.Int64Counter("playpipe.plays.derived", metric.WithDescription("track plays derived and committed (below-minimum plays included)"))
	errs = append(errs, err)
	p.mBelow, err = m.Int64Counter("playpipe.plays.below_minimum", metric.WithDescription("derived plays shorter than the minimum play length (counted, not posted)"))
	errs = append(errs, err)
	p.mRejected, err = m.Int64Counter("playpipe.events.rejected", metric.WithDescription("events sent to the rejected topic, by reason"))
	errs = append(errs, err)
	p.mNoPlays, err = m.Int64Counter("playpipe.events.without_plays", metric.WithDescription("valid events that yielded no track play (segment past the mix end or before its first track)"))
	errs = append(errs, err)
	return errors.Join(errs...)
}

// abandonTxn resets what a transaction left when its session failed
// before ending it (a flush that failed: endTxn was not called), counting
// it aborted; a transaction already ended leaves nothing and is not
// counted again.
func (p *processor) abandonTxn() {
	p.errMu.Lock()
	left := p.prodErr != nil || len(p.refused) > 0
	p.errMu.Unlock()
	if left || p.used > 0 || len(p.spans) > 0 || p.pending != (Stats{}) {
		p.endTxn(false)
	}
}

// endTxn resets the arenas and moves the pending counts to the committed
// ones when the transaction committed.
func (p *processor) endTxn(committed bool) {
	p.errMu.Lock()
	p.prodErr = nil
	p.refused = p.refused[:0]
	p.errMu.Unlock()
	if committed && len(p.poison) > 0 {
		for _, sp := range p.spans {
			delete(p.poison, sp.loc) // committed past it
		}
	}
	p.spans = p.spans[:0]
	p.used = 0
	p.buf = p.buf[:0]
	pend := p.pending
	p.pending = Stats{}
	reasons := p.rejectedByReason
	p.statsMu.Lock()
	if committed {
		p.committed.Events += pend.Events
		p.committed.Plays += pend.Plays
		p.committed.BelowMinimum += pend.BelowMinimum
		p.committed.Rejected += pend.Rejected
		p.committed.WithoutPlays += pend.WithoutPlays
		p.committed.Commits++
	} else {
		p.committed.Aborts++
	}
	p.statsMu.Unlock()
	if committed && p.mEvents != nil {
		ctx := context.Background()
		p.mEvents.Add(ctx, pend.Events)
		p.mPlays.Add(ctx, pend.Plays)
		p.mBelow.Add(ctx, pend.BelowMinimum)
		p.mNoPlays.Add(ctx, pend.WithoutPlays)
		for r, n := range reasons {
			p.mRejected.Add(ctx, n, metric.WithAttributes(attribute.String("reason", r)))
		}
	}
	clear(p.rejectedByReason)
}

// arenaChunk is the number of records per arena chunk.
const arenaChunk = 1024

func (p *processor) newRecord(topic string) *kgo.Record {
	c, i := p.used/arenaChunk, p.used%arenaChunk
	if c == len(p.arena) {
		p.arena = append(p.arena, make([]kgo.Record, arenaChunk))
	}
	r := &p.arena[c][i]
	p.used++
	*r = kgo.Record{Topic: topic}
	return r
}

// holder decides, for each parsed event in order, whether it is held
// instead of enriched now (its mix is not served yet, or an event with its
// key is held), and then holds it; the transaction loop implements it.
type holder interface {
	hold(it *item) bool
	// waited reports whether mix id is being fetched in the background for
	// held events: events of it are held at once, without waiting.
	waited(id int64) bool
}

// process validates, splits and encodes recs. Mixes not cached are fetched,
// waiting until waitCtx ends; the events whose mix is still missing then,
// or that h holds for their key, are handed to h instead of being enriched.
// The returned records are valid until the transaction ends.
func (p *processor) process(ctx, waitCtx context.Context, recs []*kgo.Record, nowMS int64, h holder) ([]*kgo.Record, error) {
	if missing := p.parse(recs, nowMS); len(missing) > 0 {
		fetch := missing[:0]
		for _, id := range missing {
			if !h.waited(id) {
				fetch = append(fetch, id)
			}
		}
		if len(fetch) > 0 {
			if err := p.fetchMissing(waitCtx, fetch); err != nil {
				return nil, err
			}
		}
	}
	p.out = p.out[:0]
	split := p.split
	split.DerivedAt = nowMS
	split.OmitReportID = true
	for i := range p.items {
		it := &p.items[i]
		if h.hold(it) {
			continue
		}
		if err := p.enrich(ctx, it, split, nowMS); err != nil {
			return nil, err
		}
	}
	return p.out, nil
}

// parse validates recs into p.items and finds their mixes in the cache. It
// returns the mixes that are not cached (each once). An event's arrival, the
// reference of the plausible-time window, is its record's timestamp (nowMS
// for a record without one), bounded by nowMS (arrivalMS): so a backlog read
// late is judged by when it arrived, not by when it is read, and a record
// stamped in the future is judged by the consumer's own clock.
func (p *processor) parse(recs []*kgo.Record, nowMS int64) (missing []int64) {
	p.items = p.items[:0]
	p.isolate = p.isolate[:0]
	for _, r := range recs {
		p.items = append(p.items, item{rec: r})
		it := &p.items[len(p.items)-1]
		if p.maxEvent > 0 && len(r.Value) > p.maxEvent {
			it.vs = []schemas.Violation{{Reason: schemas.ReasonTooLarge,
				Detail: fmt.Sprintf("event is %d bytes, longer than the maximum event size of %d bytes (--max-event-bytes)", len(r.Value), p.maxEvent)}}
			continue
		}
		vopts := p.validate
		vopts.ArrivalMS = arrivalMS(r, nowMS)
		it.ev, it.vs = schemas.ParseEvent(r.Value, vopts)
		if it.vs != nil {
			continue
		}
		if !it.lookup(p.cache) && !containsID(missing, it.ev.MixID) {
			missing = append(missing, it.ev.MixID)
		}
	}
	return missing
}

// arrivalMS is the record's timestamp in epoch ms, never later than nowMS
// (the consumer's clock, Config.Now), and nowMS for a record without one.
// Whoever produces a record sets its timestamp: a record stamped in 2100
// carrying started_at 2100 was inside its own window and delivered with a
// playedat of 2100, so the window's upper bound is the consumer's clock
// plus --time-window-ahead, however the record is stamped. (An old
// timestamp is kept: a backlog is judged by when it arrived.)
func arrivalMS(r *kgo.Record, nowMS int64) int64 {
	if ms := r.Timestamp.UnixMilli(); ms > 0 && ms < nowMS {
		return ms
	}
	return nowMS
}

// lookup sets the item's listing, or its violation when the cache holds a
// verdict on the mix; false when the cache knows nothing of the mix.
func (it *item) lookup(c *MixCache) bool {
	l, err := c.Lookup(it.ev.MixID)
	switch {
	case err != nil:
		it.vs = mixViolation(it.ev.MixID, err)
	case l != nil:
		it.listing = l
	default:
		return false
	}
	return true
}

// fetchMissing fetches the missing mixes, waiting until waitCtx ends, and
// gives the items that waited for them their listing or violation. Items
// whose mix did not come in time keep neither (the caller holds them).
func (p *processor) fetchMissing(waitCtx context.Context, missing []int64) error {
	if err := p.resolve(waitCtx, missing); err != nil {
		var tooLong *errWaitTooLong
		if !errors.As(err, &tooLong) {
			return err
		}
	}
	for i := range p.items {
		it := &p.items[i]
		if it.vs != nil || it.listing != nil || !containsID(missing, it.ev.MixID) {
			continue
		}
		it.fetched = true
		if it.lookup(p.cache) || waitCtx.Err() != nil {
			continue
		}
		// Resolved moments ago but already evicted or expired (a tiny
		// cache or TTL): fetch once more, waiting as needed.
		l, err := p.cache.Get(waitCtx, it.ev.MixID)
		switch {
		case rejectsEvents(err):
			it.vs = mixViolation(it.ev.MixID, err)
		case err != nil && waitCtx.Err() != nil:
			// Not in time: held by the caller.
		case err != nil:
			return err
		default:
			it.listing = l
		}
	}
	return nil
}

// enrich turns one parsed event into its output records in p.out: its
// track plays, or its rejection.
func (p *processor) enrich(ctx context.Context, it *item, split SplitOptions, nowMS int64) error {
	ectx := ctx
	if len(it.rec.Headers) > 0 {
		ectx = telemetry.Extract(ctx, it.rec)
	}
	ectx, span := p.tracer.Start(ectx, "enrich", p.spanOpts...)
	defer span.End()
	traced := trace.SpanContextFromContext(ectx).IsValid()
	p.pending.Events++
	loc := srcLoc{it.rec.Topic, it.rec.Partition, it.rec.Offset}
	isoStart := -1 // ≥ 0: this event's records start there in p.out and are produced on their own
	p.spans = append(p.spans, evSpan{first: p.used, loc: loc})
	if ps := p.poison[loc]; ps != nil {
		// Kafka refused this event's records before: produce them
		// between flushes (batches of their own), or, past the bound,
		// its rejection.
		if ps.n >= p.maxProduce {
			return p.rejectPoisoned(ectx, it, ps, nowMS)
		}
		isoStart = len(p.out)
	}
	if it.vs == nil {
		var v *schemas.Violation
		split.EventAt = max(0, it.rec.Timestamp.UnixMilli())
		p.plays, v = Split(p.plays[:0], &it.ev, it.listing, split)
		if v != nil {
			it.vs = []schemas.Violation{*v}
		} else if len(p.plays) == 0 {
			p.pending.WithoutPlays++
		}
	}
	if it.vs != nil {
		p.reject(ectx, it, nowMS)
		if span.IsRecording() {
			span.SetAttributes(attribute.String("playpipe.event_id", it.ev.EventID), attribute.String("playpipe.rejected", it.vs[0].Reason))
		}
	} else {
		p.emitPlays(ectx, span, it, traced)
		if span.IsRecording() {
			span.SetAttributes(attribute.String("playpipe.event_id", it.ev.EventID), attribute.Int64("playpipe.mix_id", it.ev.MixID),
				attribute.Bool("playpipe.mixcache.hit", !it.fetched),
				attribute.Int("playpipe.plays", len(p.plays)))
		}
	}
	if isoStart >= 0 {
		p.isolate = append(p.isolate, [2]int{isoStart, len(p.out)})
	}
	return nil
}

// rejectPoisoned rejects as produce_failed an event whose outputs Kafka
// refused MaxProduceAttempts times, keeping less of its raw bytes the more
// often even its rejection was refused; its rejection is produced on its own.
func (p *processor) rejectPoisoned(ctx context.Context, it *item, ps *poisonState, nowMS int64) error {
	if ps.n >= 3*p.maxProduce {
		return fmt.Errorf("consumer: Kafka refuses even a rejection without raw bytes of the event at %s (%d failures): %s", ps.loc, ps.n, ps.err)
	}
	start := len(p.out)
	maxRaw := schemas.MaxRejectionRaw
	if ps.n >= 2*p.maxProduce {
		maxRaw = 0 // the bounded rejection was refused too: keep only length and hash
	}
	it.vs = []schemas.Violation{{Reason: schemas.ReasonProduceFailed,
		Detail: trunc(fmt.Sprintf("Kafka refused what this event yields %d times: %s", ps.n, ps.err), 400)}}
	p.rejectBounded(ctx, it, nowMS, maxRaw)
	p.isolate = append(p.isolate, [2]int{start, len(p.out)})
	return nil
}

// emitPlays encodes the track plays in p.plays of the event it into
// records of the reports topic. A producer span per event for its track
// plays (only when span is recording): the reporter's consume span becomes
// its child.
func (p *processor) emitPlays(ectx context.Context, span trace.Span, it *item, traced bool) {
	pctx, send := ectx, trace.Span(nil)
	if span.IsRecording() {
		pctx, send = p.tracer.Start(ectx, "send "+p.topics.Reports, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("messaging.system", "kafka"), attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", p.topics.Reports), attribute.Int("messaging.batch.message_count", len(p.plays))))
	}
	for j := range p.plays {
		pl := &p.plays[j]
		r := p.newRecord(p.topics.Reports)
		start := len(p.buf)
		p.buf = schemas.AppendReportID(p.buf, it.ev.EventID, pl.Position)
		mid := len(p.buf)
		p.buf = schemas.AppendTrackPlayWithID(p.buf, pl, p.buf[start:mid])
		r.Key = p.buf[start:mid:mid]
		r.Value = p.buf[mid:len(p.buf):len(p.buf)]
		if traced {
			telemetry.Inject(pctx, r)
		}
		p.out = append(p.out, r)
		p.pending.Plays++
		if pl.BelowMinimum {
			p.pending.BelowMinimum++
		}
	}
	if send != nil {
		send.End()
	}
}
