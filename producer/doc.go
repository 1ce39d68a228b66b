// Package producer is the Go library for fleets' backends: it puts player
// events on Kafka.
//
// Every event is validated with schemas.ParseEvent before it is sent; valid
// events go to <prefix>.events keyed by event_id with W3C trace context in
// their headers, and the caller is told per event whether it is on the
// topic.
//
// A Publisher (franz-go: idempotent producer, acks from all in-sync
// replicas) is built from a Config: brokers, SASL, TLS, topic names and
// batching, validated once by NewPublisher. Publish sends a batch and
// returns only after Kafka acknowledged (or failed) every valid event of it;
// it never reports an event as published that is not on the topic. It
// blocks when its bounded buffer is full; it never drops. A Publisher is
// safe for concurrent use; Close flushes and may be called more than once.
//
// The package depends on franz-go, the OpenTelemetry API (spans and one
// counter, on the providers given in Config or the global ones) and
// playpipe's schemas only, so a fleet can import it alone. The HTTP ingest
// gateway (producer/gateway) and the fleet simulator (producer/simulator)
// are built on it in packages of their own.
package producer
