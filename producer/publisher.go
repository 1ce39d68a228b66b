package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/schemas"
)

const instrumentation = "github.com/playpipe/playpipe/producer"

// propagator writes W3C trace context and baggage into the records'
// headers, whatever the global propagator is: the consumer reads these.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// inject writes the trace context of ctx (traceparent, tracestate) into r's headers.
func inject(ctx context.Context, r *kgo.Record) { propagator.Inject(ctx, kotel.NewRecordCarrier(r)) }

// Errors of Publish. Use errors.Is.
var (
	// ErrInvalidEvent: the event broke a rule of the player event schema; it
	// was not sent to the events topic (see Result.Violations).
	ErrInvalidEvent = errors.New("producer: invalid event")
	// ErrNotPublished: Kafka did not acknowledge the event (broker down,
	// delivery timeout, authorization, context ended). Retrying may succeed.
	ErrNotPublished = errors.New("producer: event not published")
	// ErrClosed: the Publisher was closed.
	ErrClosed = errors.New("producer: publisher closed")
	// ErrUnacknowledged: the event was handed to Kafka but not acknowledged
	// when the call's deadline passed (the broker frozen, slow or cut off
	// mid-request). Its fate is unknown: the producer keeps it and it may
	// still be written; retrying it may publish it twice (see StatusUnknown).
	ErrUnacknowledged = errors.New("producer: event not acknowledged by Kafka within the deadline; it may still be published")
)

// InvalidEventError is the error of a Result for an event that broke rules.
type InvalidEventError struct{ Violations []schemas.Violation }

func (e *InvalidEventError) Error() string {
	s := "producer: invalid event"
	for i, v := range e.Violations {
		if i == 3 {
			s += fmt.Sprintf(" (and %d more)", len(e.Violations)-3)
			break
		}
		s += "; " + v.String()
	}
	return s
}

// Is makes errors.Is(err, ErrInvalidEvent) true.
func (e *InvalidEventError) Is(target error) bool { return target == ErrInvalidEvent }

// PublishError is the error of a Result for a valid event that Kafka did not
// acknowledge. errors.Is(err, ErrNotPublished) is true; Unwrap gives the cause.
type PublishError struct {
	Topic string
	Err   error
}

func (e *PublishError) Error() string {
	return "producer: event not published to " + e.Topic + ": " + e.Err.Error()
}
func (e *PublishError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrNotPublished) true, except for an event whose
// fate is unknown (ErrUnacknowledged): that one may be on the topic.
func (e *PublishError) Is(target error) bool {
	return target == ErrNotPublished && !errors.Is(e.Err, ErrUnacknowledged)
}

// Publisher validates player events and publishes them to Kafka (franz-go,
// idempotent producer, acks from all in-sync replicas). Safe for concurrent use.
type Publisher struct {
	cfg    Config
	cl     *kgo.Client
	tracer trace.Tracer

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup
	closeErr error
	once     sync.Once

	events metric.Int64Counter
}

// NewPublisher builds a Publisher. It does not wait for the brokers (see
// Ping): a role may start before Kafka is reachable.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	opts, err := cfg.ConnOpts()
	if err != nil {
		return nil, err
	}
	opts = append(opts,
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.ProducerLinger(cfg.Linger),
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords),
		kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
	opts = append(opts, cfg.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("producer: kafka client: %w", err)
	}
	events, err := cfg.MeterProvider.Meter(instrumentation).Int64Counter("playpipe.producer.events",
		metric.WithDescription("Events handed to the producer, by outcome: accepted (on the topic), refused (invalid), failed (not acknowledged)."))
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("producer: counter: %w", err)
	}
	_ = ctx // reserved: the client connects lazily
	return &Publisher{cfg: cfg, cl: cl, events: events, tracer: cfg.TracerProvider.Tracer(instrumentation)}, nil
}

// Topic returns the topic valid events are published to.
func (p *Publisher) Topic() string { return p.cfg.Topic }

// TopicPrefix returns the prefix of the pipeline's topic names
// (Config.TopicPrefix with its default applied).
func (p *Publisher) TopicPrefix() string { return p.cfg.TopicPrefix }

// DeliveryTimeout is the longest a Publish or WriteRecords call waits for
// Kafka when its context has no earlier deadline (Config.DeliveryTimeout).
func (p *Publisher) DeliveryTimeout() time.Duration { return p.cfg.DeliveryTimeout }

// Ping checks that a broker answers (for readiness probes).
func (p *Publisher) Ping(ctx context.Context) error {
	if err := p.cl.Ping(ctx); err != nil {
		return fmt.Errorf("producer: kafka ping: %w", err)
	}
	return nil
}

// Status of one event in a Result.
type Status string

// The statuses of an event.
const (
	StatusAccepted Status = "accepted" // on the topic, acknowledged by Kafka
	StatusRefused  Status = "refused"  // broke a rule; not sent (retrying will not help)
	StatusFailed   Status = "failed"   // valid but not on Kafka (never written); retry it
	// StatusUnknown: valid and handed to Kafka, but not acknowledged when
	// the call's deadline passed. It may be on the topic already or be
	// written later (the idempotent producer keeps it until the broker
	// answers), or never: retrying it is the way to be sure, and may publish
	// it twice (event_id tells the copies apart downstream).
	StatusUnknown Status = "unknown"
)

// Result is the outcome of one event of a Publish call.
type Result struct {
	Index   int    // position in the batch
	EventID string // the event's event_id; for a refused event, when it could be read
	Status  Status
	// Partition and Offset locate an accepted event on the topic.
	Partition int32
	Offset    int64
	// Violations are the broken rules of a refused event.
	Violations []schemas.Violation
	// Err is nil for an accepted event, an *InvalidEventError for a refused
	// one and a *PublishError for a failed one or one of unknown fate (it
	// wraps ErrUnacknowledged then).
	Err error
}

// PublishOption adjusts one Publish call.
type PublishOption func(*publishOpts)

type publishOpts struct {
	headers []kgo.RecordHeader
	arrival time.Time
}

// WithHeaders adds headers to every record of the batch (after the trace context).
func WithHeaders(h ...kgo.RecordHeader) PublishOption {
	return func(o *publishOpts) { o.headers = append(o.headers, h...) }
}

// WithArrival sets the arrival time the batch's events are checked against
// (the plausible-time window of Config.Validate) instead of Config.Now at
// the call: the ingest gateway passes the time its request arrived.
func WithArrival(t time.Time) PublishOption {
	return func(o *publishOpts) { o.arrival = t }
}

// StartedAt returns t as a player event's started_at: epoch milliseconds,
// the only unit the pipeline accepts (seconds or microseconds are refused
// implausible_time). Fleets building events should use it rather than
// converting by hand.
func StartedAt(t time.Time) int64 { return t.UnixMilli() }

// enter registers a call that Close waits for; false once closed.
func (p *Publisher) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.inflight.Add(1)
	return true
}

// Publish validates every event of the batch, sends the valid ones to the
// events topic keyed by event_id (the raw bytes verbatim, unknown fields
// kept), and returns when Kafka acknowledged or failed each of them, or when
// ctx ends, whichever comes first: it never waits longer than ctx allows,
// nor longer than Config.DeliveryTimeout when ctx has no earlier deadline,
// whatever the broker does. An event still unanswered then is StatusUnknown
// (its record stays with the producer and may yet be written). The results
// are in batch order. The error is nil when every valid event is on the
// topic (refused events do not make it fail); otherwise it wraps
// ErrNotPublished, ErrUnacknowledged or ErrClosed and the results say which
// events failed. The caller must not modify events until Publish returns,
// nor those answered StatusUnknown afterwards (their records hold them).
func (p *Publisher) Publish(ctx context.Context, events [][]byte, opts ...PublishOption) ([]Result, error) {
	var o publishOpts
	for _, opt := range opts {
		opt(&o)
	}
	results := make([]Result, len(events))
	for i := range results {
		results[i].Index = i
	}
	if !p.enter() {
		for i := range results {
			results[i].Status, results[i].Err = StatusFailed, ErrClosed
		}
		return results, ErrClosed
	}
	defer p.inflight.Done()
	ctx, cancel := p.bounded(ctx)
	defer cancel()

	ctx, span := p.tracer.Start(ctx, "publish "+p.cfg.Topic, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.destination.name", p.cfg.Topic),
			attribute.Int("messaging.batch.message_count", len(events))))
	defer span.End()

	if o.arrival.IsZero() {
		o.arrival = p.cfg.Now()
	}
	vopts := p.cfg.Validate
	vopts.ArrivalMS = o.arrival.UnixMilli()
	w := newWaiter()
	sendCtx, cancelSend := sendContext(ctx)
	defer cancelSend()
	for i, raw := range events {
		p.send(sendCtx, w, raw, &results[i], o.headers, vopts)
	}
	w.wait(ctx, results, func(res *Result) {
		res.Status, res.Err = StatusUnknown, &PublishError{Topic: p.cfg.Topic, Err: ErrUnacknowledged}
	})

	accepted, refused, failed, firstErr := tally(results)
	p.count(ctx, accepted, refused, failed)
	span.SetAttributes(attribute.Int64("playpipe.events.accepted", accepted), attribute.Int64("playpipe.events.refused", refused))
	if failed > 0 {
		span.SetStatus(codes.Error, "events not published")
		return results, fmt.Errorf("producer: %d of %d events not published: %w", failed, len(events), firstErr)
	}
	return results, nil
}

// bounded returns ctx with Config.DeliveryTimeout as its deadline unless it
// has an earlier one.
func (p *Publisher) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if p.cfg.DeliveryTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
}

// sendContext is the context records are produced with: it ends a fifth
// (at most a second) before ctx's deadline, so that the producer fails the
// records it has not sent yet (they cannot be on Kafka) in time for the call
// to answer them failed — safe to retry — rather than unknown. A record
// already in a request the broker has not answered is never failed
// (idempotence forbids it): its call answers unknown at the deadline.
func sendContext(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, dl.Add(-min(time.Until(dl)/5, time.Second)))
}

// waiter collects the acknowledgements of one call's records until the
// call's deadline: promises settle results under mu until wait returns;
// later ones find settled set and leave the caller's results alone.
type waiter struct {
	mu      sync.Mutex
	settled bool          // wait has returned: results belong to the caller
	left    int           // records not answered yet
	done    chan struct{} // closed when left reaches 0 after wait began
	started bool          // every record was handed over
}

func newWaiter() *waiter { return &waiter{done: make(chan struct{})} }

// add registers one record handed to the client.
func (w *waiter) add() {
	w.mu.Lock()
	w.left++
	w.mu.Unlock()
}

// answer runs fn (which settles the record's result) unless the call has
// returned already, and reports whether it ran.
func (w *waiter) answer(fn func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	ran := !w.settled
	if ran {
		fn()
	}
	w.left--
	if w.left == 0 && w.started {
		close(w.done)
	}
	return ran
}

// wait waits until every record is answered or ctx ends; then every result
// of results still unsettled (empty Status) gets unknown.
func (w *waiter) wait(ctx context.Context, results []Result, unknown func(*Result)) {
	w.mu.Lock()
	w.started = true
	if w.left == 0 {
		close(w.done)
	}
	w.mu.Unlock()
	select {
	case <-w.done:
	case <-ctx.Done():
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.settled = true
	for i := range results {
		if results[i].Status == "" {
			unknown(&results[i])
		}
	}
}

// send validates one event (vopts: the policy with the batch's arrival): a refused one is settled in res at once, a
// valid one is produced (with its own span, whose context goes into the
// record's headers) and settled in res by the acknowledgement, unless w's
// call has returned by then.
func (p *Publisher) send(ctx context.Context, w *waiter, raw []byte, res *Result, headers []kgo.RecordHeader, vopts schemas.ValidateOptions) {
	ev, vs := schemas.ParseEvent(raw, vopts)
	if vs != nil {
		eid := LenientEventID(raw)
		w.mu.Lock()
		res.EventID = eid
		res.Status, res.Violations, res.Err = StatusRefused, vs, &InvalidEventError{Violations: vs}
		w.mu.Unlock()
		return
	}
	w.mu.Lock()
	res.EventID = ev.EventID
	w.mu.Unlock()
	rctx, rspan := p.tracer.Start(ctx, "send "+p.cfg.Topic, trace.WithSpanKind(trace.SpanKindProducer))
	rec := &kgo.Record{Topic: p.cfg.Topic, Key: []byte(ev.EventID), Value: raw}
	inject(rctx, rec)
	rec.Headers = append(rec.Headers, headers...)
	w.add()
	p.cl.Produce(ctx, rec, func(r *kgo.Record, err error) {
		if err != nil {
			rspan.RecordError(err)
			rspan.SetStatus(codes.Error, "not published")
		}
		rspan.End()
		if !w.answer(func() {
			if err != nil {
				res.Status, res.Err = StatusFailed, &PublishError{Topic: p.cfg.Topic, Err: err}
			} else {
				res.Status, res.Partition, res.Offset = StatusAccepted, r.Partition, r.Offset
			}
		}) {
			p.late(err)
		}
	})
}

// late counts the answer Kafka gave for an event after its call returned
// StatusUnknown for it: written late, or failed after all.
func (p *Publisher) late(err error) {
	outcome := "late_accepted"
	if err != nil {
		outcome = "late_failed"
	}
	p.events.Add(context.Background(), 1, metric.WithAttributes(attribute.String("outcome", outcome)))
}

// tally counts the outcomes of a batch and returns the first failure.
func tally(results []Result) (accepted, refused, failed int64, firstErr error) {
	for i := range results {
		switch results[i].Status {
		case StatusAccepted:
			accepted++
		case StatusRefused:
			refused++
		default: // failed or unknown
			failed++
			if firstErr == nil {
				firstErr = results[i].Err
			}
		}
	}
	return accepted, refused, failed, firstErr
}

func (p *Publisher) count(ctx context.Context, accepted, refused, failed int64) {
	for _, c := range []struct {
		n       int64
		outcome string
	}{{accepted, "accepted"}, {refused, "refused"}, {failed, "failed"}} {
		if c.n > 0 {
			p.events.Add(ctx, c.n, metric.WithAttributes(attribute.String("outcome", c.outcome)))
		}
	}
}

// PublishEvents encodes events as JSON and publishes them (see Publish).
func (p *Publisher) PublishEvents(ctx context.Context, events []schemas.PlayerEvent, opts ...PublishOption) ([]Result, error) {
	raws := make([][]byte, len(events))
	for i := range events {
		b, err := json.Marshal(&events[i])
		if err != nil {
			return nil, fmt.Errorf("producer: encode event %d: %w", i, err)
		}
		raws[i] = b
	}
	return p.Publish(ctx, raws, opts...)
}

// WriteRecords produces recs as they are (topic, key, value and headers set
// by the caller; no validation, no trace context added) through the
// Publisher's client, and waits until Kafka acknowledged or failed each, or
// until ctx ends (at most Config.DeliveryTimeout when ctx has no earlier
// deadline): errs[i] is nil or the *PublishError of recs[i], which wraps
// ErrUnacknowledged when its fate is unknown. It is for records beside the
// events, such as the rejection records of events refused before Kafka (the
// ingest gateway writes these). Like Publish, it fails with ErrClosed once
// the Publisher is closed, and Close waits for it.
func (p *Publisher) WriteRecords(ctx context.Context, recs []*kgo.Record) (errs []error) {
	errs = make([]error, len(recs))
	if len(recs) == 0 {
		return errs
	}
	if !p.enter() {
		for i := range errs {
			errs[i] = ErrClosed
		}
		return errs
	}
	defer p.inflight.Done()
	ctx, cancel := p.bounded(ctx)
	defer cancel()
	w := newWaiter()
	sendCtx, cancelSend := sendContext(ctx)
	defer cancelSend()
	answered := make([]bool, len(recs))
	for i, rec := range recs {
		w.add()
		p.cl.Produce(sendCtx, rec, func(_ *kgo.Record, err error) {
			w.answer(func() {
				answered[i] = true
				if err != nil {
					errs[i] = &PublishError{Topic: rec.Topic, Err: err}
				}
			})
		})
	}
	w.wait(ctx, nil, nil)
	for i, ok := range answered { // w is settled: no promise writes any more
		if !ok {
			errs[i] = &PublishError{Topic: recs[i].Topic, Err: ErrUnacknowledged}
		}
	}
	return errs
}

// Close waits for running Publish calls (until ctx ends), flushes and closes
// the Kafka client. Publish calls after Close fail with ErrClosed. Safe to
// call more than once; later calls return the first call's error.
func (p *Publisher) Close(ctx context.Context) error {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		done := make(chan struct{})
		go func() { p.inflight.Wait(); close(done) }() // ends once the client fails or finishes every record
		select {
		case <-done:
		case <-ctx.Done():
			p.closeErr = fmt.Errorf("producer: close: publish calls still running: %w", ctx.Err())
		}
		if err := p.cl.Flush(ctx); err != nil && p.closeErr == nil {
			p.closeErr = fmt.Errorf("producer: close: flush: %w", err)
		}
		p.cl.Close()
		<-done
	})
	return p.closeErr
}

// LenientEventID reads event_id from an event that failed validation, for
// an answer to its sender; "" when it has no readable one.
func LenientEventID(raw []byte) string {
	var v struct {
		EventID string `json:"event_id"`
	}
	if !utf8.Valid(raw) || json.Unmarshal(raw, &v) != nil || len(v.EventID) > schemas.MaxEventIDLen {
		return ""
	}
	return v.EventID
}
