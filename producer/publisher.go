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
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/schemas"
)

const instrumentation = "github.com/playpipe/playpipe/producer"

var meter = otel.Meter(instrumentation)

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

// PublisherConfig configures a Publisher. Zero values take the defaults named
// in the comments; NewPublisher validates it once.
type PublisherConfig struct {
	// Kafka is the connection (brokers, SASL, TLS) shared by every role;
	// at least one broker is required.
	Kafka kafkax.Config
	// Topic receives the valid events; defaults to Kafka.Topics().Events.
	Topic string
	// Validate is the deployment's event policy (events without user_id,
	// default vendor). It must match the consumer's.
	Validate schemas.ValidateOptions
	// Linger is how long a partition waits to fill a batch; defaults to 5 ms.
	// Publish always waits for the acknowledgement, so this is latency added
	// to a small batch in exchange for fewer, larger produce requests.
	Linger time.Duration
	// MaxBufferedRecords bounds the records waiting for Kafka; Publish blocks
	// when the buffer is full (it never drops). Defaults to 100000.
	MaxBufferedRecords int
	// DeliveryTimeout is how long an event may wait for Kafka's
	// acknowledgement before it fails with ErrNotPublished; defaults to 30 s.
	DeliveryTimeout time.Duration
	// TracerProvider makes the producer spans (one per batch, one per event,
	// whose context goes into the record's headers); defaults to the global
	// provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
	// ClientOpts are extra franz-go options, applied last (tuning, tests).
	ClientOpts []kgo.Opt
}

func (c *PublisherConfig) setDefaults() {
	if c.Kafka.Partitions == 0 {
		c.Kafka.Partitions = 6 // only used when creating topics; the flag's default
	}
	if c.Topic == "" {
		c.Topic = c.Kafka.Topics().Events
	}
	if c.Linger == 0 {
		c.Linger = 5 * time.Millisecond
	}
	if c.MaxBufferedRecords == 0 {
		c.MaxBufferedRecords = 100000
	}
	if c.DeliveryTimeout == 0 {
		c.DeliveryTimeout = 30 * time.Second
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
}

func (c *PublisherConfig) validate() error {
	if len(c.Kafka.Brokers) == 0 {
		return errors.New("producer: PublisherConfig.Kafka.Brokers is empty; at least one host:port is required")
	}
	if err := c.Kafka.Validate(); err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	if c.Linger < 0 {
		return fmt.Errorf("producer: PublisherConfig.Linger must be ≥ 0, got %s", c.Linger)
	}
	if c.MaxBufferedRecords < 1 {
		return fmt.Errorf("producer: PublisherConfig.MaxBufferedRecords must be ≥ 1, got %d", c.MaxBufferedRecords)
	}
	if c.DeliveryTimeout < 0 {
		return fmt.Errorf("producer: PublisherConfig.DeliveryTimeout must be ≥ 0, got %s", c.DeliveryTimeout)
	}
	return nil
}

// Publisher validates player events and publishes them to Kafka (franz-go,
// idempotent producer, acks from all in-sync replicas). Safe for concurrent use.
type Publisher struct {
	cfg    PublisherConfig
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
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	base, err := cfg.Kafka.ClientOpts()
	if err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	opts := append(base,
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
	events, _ := meter.Int64Counter("playpipe.producer.events",
		metric.WithDescription("Events handed to the producer, by outcome: accepted (on the topic), refused (invalid), failed (not acknowledged)."))
	_ = ctx // reserved: the client connects lazily
	return &Publisher{cfg: cfg, cl: cl, events: events, tracer: cfg.TracerProvider.Tracer(instrumentation)}, nil
}

// Topic returns the topic valid events are published to.
func (p *Publisher) Topic() string { return p.cfg.Topic }

// Ping checks that a broker answers (for readiness probes).
func (p *Publisher) Ping(ctx context.Context) error {
	if err := p.cl.Ping(ctx); err != nil {
		return fmt.Errorf("producer: kafka ping: %w", err)
	}
	return nil
}

// Status of one event in a Result.
type Status string

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
	// RejectionErr is set when WithRejections was given and the rejection
	// record of a refused event was not acknowledged.
	RejectionErr error
}

// PublishOption adjusts one Publish call.
type PublishOption func(*publishOpts)

type publishOpts struct {
	headers      []kgo.RecordHeader
	rejectTopic  string
	rejectSource string
}

// WithHeaders adds headers to every record of the batch (after the trace context).
func WithHeaders(h ...kgo.RecordHeader) PublishOption {
	return func(o *publishOpts) { o.headers = append(o.headers, h...) }
}

// WithRejections also publishes every refused event, as a schemas.Rejection
// whose Source is {Topic: source, Partition: -1, Offset: -1}, to topic (the
// rejected topic), so the audit ledger counts events refused before Kafka.
// Publish waits for those records too.
func WithRejections(topic, source string) PublishOption {
	return func(o *publishOpts) { o.rejectTopic, o.rejectSource = topic, source }
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
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		for i := range results {
			results[i].Status, results[i].Err = StatusFailed, ErrClosed
		}
		return results, ErrClosed
	}
	p.inflight.Add(1)
	p.mu.Unlock()
	defer p.inflight.Done()

	ctx, span := p.tracer.Start(ctx, "publish "+p.cfg.Topic, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.destination.name", p.cfg.Topic),
			attribute.Int("messaging.batch.message_count", len(events))))
	defer span.End()

	var wg sync.WaitGroup
	now := time.Now().UnixMilli()
	for i, raw := range events {
		res := &results[i]
		ev, vs := schemas.ParseEvent(raw, p.cfg.Validate)
		if vs != nil {
			res.EventID = lenientEventID(raw)
			res.Status, res.Violations, res.Err = StatusRefused, vs, &InvalidEventError{Violations: vs}
			if o.rejectTopic != "" {
				rej := schemas.NewRejection(raw, res.EventID, vs, schemas.Source{Topic: o.rejectSource, Partition: -1, Offset: -1}, now)
				val, err := json.Marshal(rej)
				if err != nil { // cannot happen for these types; never drop silently
					res.RejectionErr = fmt.Errorf("producer: encode rejection: %w", err)
					continue
				}
				rec := &kgo.Record{Topic: o.rejectTopic, Value: val}
				if res.EventID != "" {
					rec.Key = []byte(res.EventID) // without one, spread over partitions
				}
				telemetry.Inject(ctx, rec)
				rec.Headers = append(rec.Headers, o.headers...)
				wg.Add(1)
				p.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
					if err != nil {
						res.RejectionErr = &PublishError{Topic: o.rejectTopic, Err: err}
					}
					wg.Done()
				})
			}
			continue
		}
		res.EventID = ev.EventID
		rctx, rspan := p.tracer.Start(ctx, "send "+p.cfg.Topic, trace.WithSpanKind(trace.SpanKindProducer))
		rec := &kgo.Record{Topic: p.cfg.Topic, Key: []byte(ev.EventID), Value: raw}
		telemetry.Inject(rctx, rec)
		rec.Headers = append(rec.Headers, o.headers...)
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
	wg.Wait()

	var accepted, refused, failed int64
	var firstErr error
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
	p.count(ctx, accepted, refused, failed)
	span.SetAttributes(attribute.Int64("playpipe.events.accepted", accepted), attribute.Int64("playpipe.events.refused", refused))
	if failed > 0 {
		span.SetStatus(codes.Error, "events not published")
		return results, fmt.Errorf("producer: %d of %d events not published: %w", failed, len(events), firstErr)
	}
	return results, nil
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

// lenientEventID reads event_id from an event that failed validation, for
// the caller's answer; "" when it has no readable one.
func lenientEventID(raw []byte) string {
	var v struct {
		EventID string `json:"event_id"`
	}
	if !utf8.Valid(raw) || json.Unmarshal(raw, &v) != nil || len(v.EventID) > schemas.MaxEventIDLen {
		return ""
	}
	return v.EventID
}
