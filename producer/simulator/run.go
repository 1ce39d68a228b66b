package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/internal/kafkax"
)

// Run sends cfg.Events messages to the events topic through
// segmentio/kafka-go (synchronous batches, murmur2 key partitioning like
// franz-go and the Java client) and returns what Kafka acknowledged. It stops
// early when ctx ends, returning the stats so far and ctx's error.
func Run(ctx context.Context, cfg Config) (stats Stats, err error) {
	cfg.setDefaults()
	stats = Stats{ByKind: map[string]int{}}
	if err := cfg.validate(); err != nil {
		return stats, err
	}
	gen, err := NewGenerator(cfg)
	if err != nil {
		return stats, err
	}
	w, err := newWriter(cfg)
	if err != nil {
		return stats, err
	}
	defer w.Close()
	s := newSender(cfg, gen)
	start := time.Now()
	defer func() { stats.Elapsed = time.Since(start) }()
	defer func() { s.endSpans(err) }()
	for {
		if s.fill(ctx) == 0 {
			return stats, nil
		}
		if err := s.send(ctx, w, &stats); err != nil {
			return stats, err
		}
	}
}

// newWriter is the kafka-go writer of a run: synchronous batches of
// cfg.BatchSize, acknowledged by every in-sync replica.
func newWriter(cfg Config) (*kafka.Writer, error) {
	transport, err := kafkaGoTransport(cfg.Kafka)
	if err != nil {
		return nil, err
	}
	return &kafka.Writer{
		Addr:         kafka.TCP(cfg.Kafka.Brokers...),
		Topic:        cfg.Topic,
		Balancer:     &kafka.Murmur2Balancer{},
		BatchSize:    cfg.BatchSize,
		BatchBytes:   16 << 20,
		BatchTimeout: cfg.BatchTimeout,
		RequiredAcks: kafka.RequireAll,
		Transport:    transport,
	}, nil
}

// sender sends a run's messages in chunks: each message with a producer
// span of its own, ended when its chunk is acknowledged (or failed).
type sender struct {
	cfg    Config
	gen    *Generator
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	lim    *rate.Limiter // nil: unlimited
	rec    *json.Encoder // nil: no record
	chunk  int

	msgs  []kafka.Message
	kinds []string
	spans []trace.Span
}

func newSender(cfg Config, gen *Generator) *sender {
	s := &sender{cfg: cfg, gen: gen, chunk: cfg.BatchSize,
		tracer: cfg.TracerProvider.Tracer(instrumentation), prop: cfg.Propagator}
	if cfg.Rate > 0 {
		s.chunk = max(1, min(s.chunk, int(cfg.Rate/20))) // ~20 writes a second keep the pace smooth
		s.lim = rate.NewLimiter(rate.Limit(cfg.Rate), s.chunk)
	}
	if cfg.Record != nil {
		s.rec = json.NewEncoder(cfg.Record)
	}
	s.msgs = make([]kafka.Message, 0, s.chunk)
	s.kinds = make([]string, 0, s.chunk)
	s.spans = make([]trace.Span, 0, s.chunk)
	return s
}

// fill takes the next chunk of messages from the generator, each with the
// trace context of its span in its headers; 0 when the run is complete.
func (s *sender) fill(ctx context.Context) int {
	s.msgs, s.kinds = s.msgs[:0], s.kinds[:0]
	for len(s.msgs) < s.chunk {
		m, ok := s.gen.Next()
		if !ok {
			break
		}
		sctx, span := s.tracer.Start(ctx, "send "+s.cfg.Topic, trace.WithSpanKind(trace.SpanKindProducer))
		s.spans = append(s.spans, span)
		s.msgs = append(s.msgs, kafka.Message{Key: m.Key, Value: m.Value, Headers: traceHeaders(sctx, s.prop)})
		s.kinds = append(s.kinds, m.Kind)
	}
	return len(s.msgs)
}

// send writes the chunk (at the configured rate), waits for Kafka's
// acknowledgement, and counts and records its messages in stats.
func (s *sender) send(ctx context.Context, w *kafka.Writer, stats *Stats) error {
	if s.lim != nil {
		if err := s.lim.WaitN(ctx, len(s.msgs)); err != nil {
			return fmt.Errorf("simulator: %w", ctxErr(ctx, err))
		}
	}
	if err := w.WriteMessages(ctx, s.msgs...); err != nil {
		return fmt.Errorf("simulator: write to %s after %d events: %w", s.cfg.Topic, stats.Sent, ctxErr(ctx, err))
	}
	s.endSpans(nil)
	for i, m := range s.msgs {
		stats.Sent++
		stats.ByKind[s.kinds[i]]++
		if s.rec != nil {
			if err := s.rec.Encode(simRecord{Kind: s.kinds[i], Key: string(m.Key), Value: string(m.Value)}); err != nil {
				return fmt.Errorf("simulator: record: %w", err)
			}
		}
	}
	return nil
}

// endSpans ends the spans of the messages sent so far, failed with err
// when it is not nil.
func (s *sender) endSpans(err error) {
	for _, sp := range s.spans {
		if err != nil {
			sp.RecordError(err)
			sp.SetStatus(codes.Error, "not published")
		}
		sp.End()
	}
	s.spans = s.spans[:0]
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// traceHeaders are the kafka-go headers carrying the trace context of ctx,
// in key order.
func traceHeaders(ctx context.Context, prop propagation.TextMapPropagator) []kafka.Header {
	mc := propagation.MapCarrier{}
	prop.Inject(ctx, mc)
	if len(mc) == 0 {
		return nil
	}
	keys := mc.Keys()
	sort.Strings(keys)
	hs := make([]kafka.Header, len(keys))
	for i, k := range keys {
		hs[i] = kafka.Header{Key: k, Value: []byte(mc[k])}
	}
	return hs
}

// simRecord is one line of Config.Record.
type simRecord struct {
	Kind  string `json:"kind"`
	Key   string `json:"key"`
	Value string `json:"value"`
}

// kafkaGoTransport builds kafka-go's transport from the shared Kafka settings
// (SASL, TLS): the TLS configuration is the fleet Publisher's.
func kafkaGoTransport(c kafkax.Config) (*kafka.Transport, error) {
	t := &kafka.Transport{ClientID: "playpipe-simulate", DialTimeout: 10 * time.Second}
	switch strings.ToUpper(c.SASLMechanism) {
	case kafkax.SASLNone:
	case kafkax.SASLPlain:
		t.SASL = plain.Mechanism{Username: c.SASLUser, Password: c.SASLPassword}
	default:
		// kafka-go's SCRAM needs a module this build does not carry; the
		// pipeline's own clients (franz-go) support SCRAM.
		return nil, fmt.Errorf("simulator: supports --kafka-sasl PLAIN or none, not %q", c.SASLMechanism)
	}
	tc, err := c.TLSSettings().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	t.TLS = tc
	return t, nil
}
