// Package roles wires playpipe's roles from plain configuration structs: the
// Kafka connection (configured brokers or the embedded broker), the partner
// API client (a configured API or a built-in sandbox on loopback, with the
// one connection-pool sizing rule, PoolSize), and the enrich consumer, the
// reporter and the ClickHouse sink over them.
//
// It is the one place roles are put together: cmd/playpipe fills the
// structs from flags and environment variables (nothing here reads either)
// and demo from struct literals, for the demo and the
// end-to-end tests. Telemetry is handed in too (telemetry.Providers, from
// telemetry.StartRole or Setup) and goes into each role's Config: no role
// reads an otel global.
package roles

import (
	"cmp"
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/reporter"
)

// Defaults of the topics playpipe creates when a Kafka configuration leaves
// them zero (the flags' defaults too).
const (
	DefaultPartitions        = 6
	DefaultReplicationFactor = -1 // the broker's default
)

// StartKafka makes the Kafka of cfg ready: zero Partitions and
// ReplicationFactor take DefaultPartitions and DefaultReplicationFactor,
// then kafkax.Ready starts the embedded broker when cfg.Embedded asks for it
// and creates the missing topics. It returns the effective configuration
// (the embedded broker's address) and the function that stops what it
// started.
func StartKafka(ctx context.Context, cfg kafkax.Config, log *slog.Logger) (kafkax.Config, func(), error) {
	if cfg.Partitions == 0 {
		cfg.Partitions = DefaultPartitions
	}
	if cfg.ReplicationFactor == 0 {
		cfg.ReplicationFactor = DefaultReplicationFactor
	}
	return kafkax.Ready(ctx, cfg, cmp.Or(log, slog.Default()))
}

// NewEnricher builds the enrich role over k, reading mixes from src; a nil
// cfg.Logger takes log, and nil cfg.MeterProvider and cfg.TracerProvider
// take tel's. The constructors' errors are the packages' own, as they are
// (each names its package and the offending flag or field).
func NewEnricher(cfg consumer.Config, k kafkax.Config, src consumer.MixSource, tel telemetry.Providers, log *slog.Logger) (*consumer.Enricher, error) {
	cfg.Kafka, cfg.Source = k, src
	cfg.Logger, cfg.MeterProvider, cfg.TracerProvider = shared(cfg.Logger, cfg.MeterProvider, cfg.TracerProvider, tel, log)
	return consumer.New(cfg)
}

// NewReporter builds the report role over k, posting through p; an empty
// cfg.PartnerURL takes p.URL (recorded in every delivery: which partner
// target answered), a nil cfg.Logger takes log, and nil cfg.MeterProvider
// and cfg.TracerProvider take tel's.
func NewReporter(cfg reporter.Config, k kafkax.Config, p *Partner, tel telemetry.Providers, log *slog.Logger) (*reporter.Reporter, error) {
	cfg.Kafka, cfg.PartnerURL = k, cmp.Or(cfg.PartnerURL, p.URL)
	cfg.Logger, cfg.MeterProvider, cfg.TracerProvider = shared(cfg.Logger, cfg.MeterProvider, cfg.TracerProvider, tel, log)
	return reporter.New(cfg, p.Client)
}

// NewSink builds the sink role from k into the ClickHouse ch (an address:
// analytics.LocalOrConfigured resolves a data folder first); a nil
// cfg.Logger takes log, and nil cfg.MeterProvider and cfg.TracerProvider
// take tel's.
func NewSink(cfg analytics.SinkConfig, k kafkax.Config, ch analytics.Config, tel telemetry.Providers, log *slog.Logger) (*analytics.Sink, error) {
	cfg.Kafka, cfg.ClickHouse = k, ch
	cfg.Logger, cfg.MeterProvider, cfg.TracerProvider = shared(cfg.Logger, cfg.MeterProvider, cfg.TracerProvider, tel, log)
	return analytics.NewSink(cfg)
}

// shared fills the fields every role's Config has: a nil logger takes log
// (then slog.Default()), nil meter and tracer providers take tel's.
func shared(l *slog.Logger, m metric.MeterProvider, t trace.TracerProvider, tel telemetry.Providers, log *slog.Logger) (*slog.Logger, metric.MeterProvider, trace.TracerProvider) {
	return cmp.Or(l, log, slog.Default()), cmp.Or(m, tel.Meter), cmp.Or(t, tel.Tracer)
}

// Publisher returns the connection and topic prefix of k as a fleet
// Publisher's configuration (the ingest gateway's and the demo's); the
// caller sets the rest. The fleet library (producer) and the roles' Kafka
// settings (kafkax) share only internal/kafkaconn, so this conversion lives
// here, above both. The publisher's requests are counted in k.Wire (the
// role's Kafka traffic metrics) when it is set.
func Publisher(k kafkax.Config) producer.Config {
	return producer.Config{Brokers: k.Brokers, SASL: k.SASL(), TLS: k.TLSSettings(), TopicPrefix: k.TopicPrefix, ClientOpts: k.Wire.Hooks()}
}
