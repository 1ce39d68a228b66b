// Package telemetry is playpipe's OpenTelemetry plumbing: it builds the
// tracer and meter providers from the standard OTEL_* variables, carries W3C
// trace context in Kafka record headers (kotel's record carrier), wraps HTTP
// servers, registers the consumer lag gauge, serves each role's admin
// endpoints, and builds the logger that stamps trace ids.
//
// Each role declares its own instruments (reporter/metrics.go,
// consumer/enricher.go, analytics/sink.go, …; their Prometheus names are in
// docs/operating.md). The command wiring a role calls, once per process:
//
//	tel, err := telemetry.StartRole(ctx, "consume", *adminAddr, log) // Setup + /metrics /healthz /readyz
//	defer tel.Close(context.Background())                         // idempotent, flushes
//	tel.AddReadyCheck("kafka", func(ctx context.Context) error { return cl.Ping(ctx) })
//	apiCfg.TracerProvider, apiCfg.MeterProvider = tel.Providers.Tracer, tel.Providers.Meter
//	enr, _ := roles.NewEnricher(cfg, kcfg, client, tel.Providers, log)    // fills the role's Config
//	meter := tel.Providers.Meter.Meter("github.com/playpipe/playpipe/cmd/playpipe")
//	reg, _ := telemetry.RegisterConsumerLag(meter, kadm.NewClient(cl), group, telemetry.ConsumerLagOptions{})
//
// What it promises:
//
//   - With no OTEL_* exporter configured, no span is exported and none is
//     recorded: the tracer is a no-op that only passes incoming trace
//     context on (measured in BenchmarkRecordTracing*). Metrics are always
//     collected and served at /metrics from a registry of their own.
//   - Providers are injected, never global: Setup returns them
//     (Role.Providers) and sets none of the otel globals, and every role
//     takes them through its Config fields (MeterProvider, TracerProvider,
//     Propagator). A library treats a nil field as a no-op provider
//     (OrNoopMeterProvider, OrNoopTracerProvider; OrW3CPropagator), except
//     the fleets' library producer, which follows otel's globals as its
//     users expect. HTTPHandler takes the providers too.
//   - The meter provider is process-wide, behind the one registry
//     MetricsHandler serves; each Setup builds a tracer provider of its own.
//   - One propagator everywhere: W3C traceparent/tracestate plus baggage
//     (Propagator), in Kafka headers (Inject, Extract) and in HTTP headers
//     (HTTPHandler, the partner API client).
//   - No header, token or credential becomes a span attribute through
//     HTTPHandler; loggers from NewLogger redact secret-named attributes, and
//     Redacted hides a value explicitly.
//   - Everything here is safe for concurrent use; Setup's shutdown, the
//     AdminServer's Run and RegisterConsumerLag's registration are owned by
//     the caller, who stops them.
package telemetry
