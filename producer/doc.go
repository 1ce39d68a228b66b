// Package producer puts player events on Kafka for fleets.
//
// Three ways in, one contract: every event is validated with
// schemas.ParseEvent before it is sent, valid events go to <prefix>.events
// keyed by event_id with W3C trace context in their headers, and a caller is
// told per event whether it is on the topic.
//
//   - Publisher (franz-go) is the Go library for fleets' backends. Publish
//     sends a batch and returns only after Kafka acknowledged (or failed)
//     every valid event of it; it never reports an event as published that is
//     not on the topic. It blocks when its bounded buffer is full; it never
//     drops. It is safe for concurrent use; Close flushes and may be called
//     more than once.
//   - Gateway is the HTTP ingest gateway (`playpipe ingest`) for fleets that
//     do not speak Kafka: per-fleet API keys (stored as SHA-256 hashes),
//     per-key rate and concurrency limits applied before a shared slot is
//     taken, bodies read under a minimum rate and a deadline, bounded bodies,
//     events and batches, a per-event answer, and 202 only after Kafka
//     acknowledged the batch. Refused events (too large ones included) are
//     also published to <prefix>.rejected (source topic "ingest") in records
//     bounded below Kafka's 1 MiB limit, so the audit ledger counts them.
//   - Simulate is a fleet simulator that publishes realistic listening
//     segments, and a chosen share of bad events, through segmentio/kafka-go:
//     a second, independent Kafka client. It is deterministic for a seed.
package producer
