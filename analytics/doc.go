// Package analytics is playpipe's audit ledger in ClickHouse: the schema
// migrations, the sink role that copies the pipeline's four topics into the
// ledger tables, and the audit queries behind `playpipe audit`.
//
// Schema: versioned migrations (Migrate) recorded in {db}.schema_migrations,
// applied by `playpipe migrate` and when a sink starts. The DDL runs
// unchanged on ClickHouse 18.16 and on current releases.
//
// Sink guarantees (Sink.Run):
//   - every record of the four topics becomes exactly one logical row: a
//     record that is not what its topic promises is kept, bytes and all, in
//     the events table (parsed = 0) or the malformed table; nothing is dropped;
//   - offsets are committed only after ClickHouse confirmed the insert of
//     every row read up to them, so a crash loses nothing;
//   - a crash between insert and commit re-inserts rows; every row carries its
//     Kafka topic/partition/offset, the tables are ReplacingMergeTree keyed on
//     it, and the audit counts distinct locations, so nothing is counted twice;
//   - while ClickHouse is down the sink keeps its batch, retries with
//     exponential backoff and jitter, and reads no further than its bounded
//     queue allows (it blocks, never drops); it catches up when ClickHouse returns;
//   - Run blocks until its context ends, then drains (insert and commit of
//     what was read) within SinkConfig.ShutdownTimeout.
//
// Audit (Auditor): counts for a window of record times, each backed by a
// list of the report ids (or event records) behind it; see docs/audit.md.
// The figures of the window's plays are read per range of report ids, each
// range one GROUP BY report id over its plays and Delivery records with
// cheap idempotent states (audit_sliced.go); Limits.Exact reads the raw
// ledger in one pass. A per-report state table (report_state, migration 7)
// was tried and dropped (migration 8; state.go). The delay reads the event
// record time each play carries (plays.event_at_ms, migration 9), with the
// events recorded twice and the old rows' events looked up (delay.go).
// Every query runs with a
// memory limit, a deadline and a progress line (guard.go).
//
// A Sink runs one consumer-group member; run several processes to share the
// partitions. Auditor and the functions of this package are safe for
// concurrent use.
package analytics
