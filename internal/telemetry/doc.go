// Package telemetry is playpipe's OpenTelemetry plumbing: it installs the
// global tracer and meter providers from the standard OTEL_* variables, carries
// W3C trace context in Kafka record headers and HTTP requests, serves each
// role's admin endpoints, and builds the logger that stamps trace ids.
//
// Roles instrument themselves with the global API only
// (otel.Tracer("github.com/playpipe/playpipe/<pkg>"), otel.Meter(…)); the
// command wiring a role calls, once per process:
//
//	shutdown, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "playpipe-consume"})
//	defer shutdown(context.Background())            // idempotent, flushes
//	admin := telemetry.NewAdminServer(*adminAddr, log)
//	admin.AddReadyCheck("kafka", func(ctx context.Context) error { return cl.Ping(ctx) })
//	go admin.Run(ctx)                               // /metrics /healthz /readyz
//	m, _ := telemetry.NewMetrics(otel.Meter("github.com/playpipe/playpipe/consumer"))
//	cl, _ := kgo.NewClient(append(opts, telemetry.KafkaHooks(telemetry.WithConsumerGroup(g)))...)
//
// What it promises:
//
//   - With no OTEL_* exporter configured, no span is exported and none is
//     recorded: the global tracer is a no-op that only passes incoming trace
//     context on (measured in BenchmarkRecordTracing*). Metrics are always
//     collected and served at /metrics from a registry of their own.
//   - One propagator everywhere: W3C traceparent/tracestate plus baggage, in
//     Kafka headers (Inject, Extract, KafkaHooks, RecordContext) and in HTTP
//     headers (HTTPTransport, HTTPHandler).
//   - No header, token or credential becomes a span attribute through these
//     wrappers; loggers from NewLogger redact secret-named attributes, and
//     Redacted / Secret hide values explicitly.
//   - Everything here is safe for concurrent use; Setup's shutdown, the
//     AdminServer's Run and RegisterConsumerLag's registration are owned by
//     the caller, who stops them.
package telemetry
