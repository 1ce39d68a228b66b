// Package demo is the all-in-one harness: every role of playpipe in one
// process — the enrich consumer, the reporter and the ClickHouse sink, wired
// by wiring/roles as the production commands wire them — over one Kafka,
// one partner API and one ClickHouse, each either configured or started
// locally (the embedded Kafka-protocol broker, the built-in sandbox, a local
// clickhouse-server). It is what `playpipe demo` and the full end-to-end
// tests run; it is not the production path, where each role is its own
// process (`playpipe consume`, `report`, `sink`).
//
// A Pipeline owns everything it started: Close stops the roles (consumer,
// then reporter, then sink, each draining within its own deadline) and then
// the local parts, in reverse order of start. Roles can be stopped and
// started again (StopRole, StartRole) to exercise crash recovery. A Pipeline
// is safe for concurrent use.
//
// Files: harness.go. Tests: harness_test.go, ingest_test.go, metrics_test.go,
// trace_test.go.
package demo
