// Package producertest holds the test helpers shared by the tests of
// producer, producer/gateway and producer/simulator: Kafka (kfake) set-up,
// valid events, reading a topic back, and the telemetry recorders.
// Only tests import it.
//
// Files: producertest.go.
package producertest
