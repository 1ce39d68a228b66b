package producer

import (
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/kafkaconn"
	"github.com/playpipe/playpipe/schemas"
)

// DefaultTopicPrefix is Config.TopicPrefix's default: events go to
// plays.events.
const DefaultTopicPrefix = "plays"

// SASL mechanisms accepted by SASL.Mechanism (case-insensitive).
const (
	SASLNone        = kafkaconn.SASLNone
	SASLPlain       = kafkaconn.SASLPlain
	SASLScramSHA256 = kafkaconn.SASLScramSHA256
	SASLScramSHA512 = kafkaconn.SASLScramSHA512
)

// SASL authenticates the connections to the brokers: Mechanism (one of the
// SASL* constants; empty for none), User (required with a Mechanism) and
// Password (a secret, never logged or put in errors).
type SASL = kafkaconn.SASL

// TLS encrypts the connections to the brokers: Enabled (TLS 1.2 or later),
// CAFile (a PEM bundle of CAs to trust besides the system's) and
// InsecureSkipVerify (testing only).
type TLS = kafkaconn.TLS

// Config configures a Publisher. Zero values take the defaults named in the
// comments; NewPublisher validates it once.
type Config struct {
	// Brokers are the seed brokers, host:port; at least one is required.
	Brokers []string
	// SASL authenticates to the brokers; none by default.
	SASL SASL
	// TLS encrypts the connections; off by default.
	TLS TLS
	// TopicPrefix prefixes the pipeline's topic names (<prefix>.events,
	// <prefix>.rejected, …); defaults to DefaultTopicPrefix.
	TopicPrefix string
	// Topic receives the valid events; defaults to <TopicPrefix>.events.
	Topic string
	// Validate is the deployment's event policy (events without user_id,
	// default vendor, the plausible-time Window). It must match the
	// consumer's. Its ArrivalMS is ignored: each Publish sets it from Now
	// (or WithArrival), so an event whose started_at is not epoch
	// milliseconds near that time is refused implausible_time.
	Validate schemas.ValidateOptions
	// Now is the clock of the arrival time events are checked against;
	// defaults to time.Now (tests inject a fixed one).
	Now func() time.Time
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
	// whose context goes into the record's headers). Nil: the global
	// provider (otel.GetTracerProvider). This package is a library for
	// fleets' backends, which install their OpenTelemetry set-up globally
	// and expect an instrumented library to follow it, as OpenTelemetry's
	// instrumentation libraries do; playpipe's own commands always pass
	// their telemetry.Role.Providers, so none of them depends on a global.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the counter playpipe.producer.events. Nil: the
	// global provider (otel.GetMeterProvider), for the same reason.
	MeterProvider metric.MeterProvider
	// ClientOpts are extra franz-go options, applied last (tuning, tests).
	ClientOpts []kgo.Opt
}

func (c *Config) setDefaults() {
	if c.TopicPrefix == "" {
		c.TopicPrefix = DefaultTopicPrefix
	}
	if c.Topic == "" {
		c.Topic = c.TopicPrefix + ".events"
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
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
}

func (c *Config) validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("producer: Config.Brokers is empty; at least one host:port is required")
	case c.Linger < 0:
		return fmt.Errorf("producer: Config.Linger must be ≥ 0, got %s", c.Linger)
	case c.MaxBufferedRecords < 1:
		return fmt.Errorf("producer: Config.MaxBufferedRecords must be ≥ 1, got %d", c.MaxBufferedRecords)
	case c.DeliveryTimeout < 0:
		return fmt.Errorf("producer: Config.DeliveryTimeout must be ≥ 0, got %s", c.DeliveryTimeout)
	}
	return c.Validate.Window.Validate()
}

// ConnOpts returns the franz-go options that reach the brokers of c (seed
// brokers, SASL, TLS) without the Publisher's own: other clients of the same
// cluster can start from them.
func (c Config) ConnOpts() ([]kgo.Opt, error) {
	return kafkaconn.Opts(c.Brokers, c.SASL, c.TLS)
}
