// Package simulator is a fleet simulator (`playpipe simulate`): it publishes
// realistic listening segments, and a chosen share of bad events, through
// segmentio/kafka-go, a second Kafka client independent of the pipeline's
// franz-go. A Generator is deterministic for a seed; Run sends its messages
// and reports what Kafka acknowledged. CatalogFromAPI reads the mixes to
// listen to from the partner API.
package simulator
