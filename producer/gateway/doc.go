// Package gateway is the HTTP ingest gateway (`playpipe ingest`) for fleets
// that do not speak Kafka, built on a producer.Publisher.
//
// It takes per-fleet API keys (stored as SHA-256 hashes), applies per-key
// rate and concurrency limits before a shared slot is taken, reads bodies
// under a minimum rate and a deadline, bounds bodies, events and batches,
// answers per event, and answers 202 only after Kafka acknowledged the
// batch. Refused events (too large ones included) are also published to
// <prefix>.rejected (source topic "ingest") in records bounded below
// Kafka's 1 MiB limit, so the audit ledger counts them. A Gateway is an
// http.Handler, safe for concurrent use; it does not close its Publisher.
package gateway
