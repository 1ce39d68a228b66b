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
func (e *PublishError) Unwrap() error        { return e.Err }
func (e *PublishError) Is(target error) bool { return target == ErrNotPublished }

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
	StatusFailed   Status = "failed"   // valid but not acknowledged by Kafka; retry it
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
	// one and a *PublishError for a failed one.
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
// kept), and returns when Kafka acknowledged or failed each of them. The
// results are in batch order. The error is nil when every valid event is on
// the topic (refused events do not make it fail); otherwise it wraps
// ErrNotPublished (or ErrClosed) and the results say which events failed.
// The caller must not modify events until Publish returns.
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
	var wg sync.WaitGroup
	for i, raw := range events {
		p.send(ctx, &wg, raw, &results[i], o.headers, vopts)
	}
	wg.Wait()

	accepted, refused, failed, firstErr := tally(results)
	p.count(ctx, accepted, refused, failed)
	span.SetAttributes(attribute.Int64("playpipe.events.accepted", accepted), attribute.Int64("playpipe.events.refused", refused))
	if failed > 0 {
		span.SetStatus(codes.Error, "events not published")
		return results, fmt.Errorf("producer: %d of %d events not published: %w", failed, len(events), firstErr)
	}
	return results, nil
}

// send validates one event (vopts: the policy with the batch's arrival): a refused one is settled in res at once, a
// valid one is produced (with its own span, whose context goes into the
// record's headers) and settled in res by the acknowledgement, which wg
// waits for.
func (p *Publisher) send(ctx context.Context, wg *sync.WaitGroup, raw []byte, res *Result, headers []kgo.RecordHeader, vopts schemas.ValidateOptions) {
	ev, vs := schemas.ParseEvent(raw, vopts)
	if vs != nil {
		res.EventID = LenientEventID(raw)
		res.Status, res.Violations, res.Err = StatusRefused, vs, &InvalidEventError{Violations: vs}
		return
	}
	res.EventID = ev.EventID
	rctx, rspan := p.tracer.Start(ctx, "send "+p.cfg.Topic, trace.WithSpanKind(trace.SpanKindProducer))
	rec := &kgo.Record{Topic: p.cfg.Topic, Key: []byte(ev.EventID), Value: raw}
	inject(rctx, rec)
	rec.Headers = append(rec.Headers, headers...)
	wg.Add(1)
	p.cl.Produce(ctx, rec, func(r *kgo.Record, err error) {
		if err != nil {
			res.Status, res.Err = StatusFailed, &PublishError{Topic: p.cfg.Topic, Err: err}
			rspan.RecordError(err)
			rspan.SetStatus(codes.Error, "not published")
		} else {
			res.Status, res.Partition, res.Offset = StatusAccepted, r.Partition, r.Offset
		}
		rspan.End()
		wg.Done()
	})
}

// tally counts the outcomes of a batch and returns the first failure.
func tally(results []Result) (accepted, refused, failed int64, firstErr error) {
	for i := range results {
		switch results[i].Status {
		case StatusAccepted:
			accepted++
		case StatusRefused:
			refused++
		default:
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
// Publisher's client, and waits until Kafka acknowledged or failed each:
// errs[i] is nil or the *PublishError of recs[i]. It is for records beside
// the events, such as the rejection records of events refused before Kafka
// (the ingest gateway writes these). Like Publish, it fails with ErrClosed
// once the Publisher is closed, and Close waits for it.
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
	var wg sync.WaitGroup
	for i, rec := range recs {
		wg.Add(1)
		p.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				errs[i] = &PublishError{Topic: rec.Topic, Err: err}
			}
			wg.Done()
		})
	}
	wg.Wait()
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
