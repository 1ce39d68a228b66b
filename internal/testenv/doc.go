// Package testenv starts the real parts that playpipe's tests run against, so
// that no test file hand-rolls its own servers: the partner API sandbox on a
// free loopback port, the embedded Kafka-protocol broker, and a local
// ClickHouse server. Each starter registers its cleanup with t.Cleanup.
package testenv
