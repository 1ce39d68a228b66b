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
//	reg, _ := telemetry.RegisterConsumerLag(meter, kadm.NewClient(cl), group, telemetry.ConsumerLagOptions{})
//
// What it promises:
//
//   - With no OTEL_* exporter configured, no span is exported and none is
//     recorded: the tracer is a no-op that only passes incoming trace
//     context on (measured in BenchmarkRecordTracing*). Metrics are always
//     collected and served at /metrics from a registry of their own.
//   - Providers are handed to libraries (Role.Providers, Config fields); a
//     library whose field is nil uses the otel globals, which Setup also
//     installs, so code not yet handed providers is instrumented the same.
//   - One propagator everywhere: W3C traceparent/tracestate plus baggage, in
//     Kafka headers (Inject, Extract) and in HTTP headers (HTTPHandler).
//   - No header, token or credential becomes a span attribute through
//     HTTPHandler; loggers from NewLogger redact secret-named attributes, and
//     Redacted hides a value explicitly.
//   - Everything here is safe for concurrent use; Setup's shutdown, the
//     AdminServer's Run and RegisterConsumerLag's registration are owned by
//     the caller, who stops them.
package telemetry
