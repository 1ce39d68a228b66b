// Package testenv starts the real parts that playpipe's tests run against, so
// that no test file hand-rolls its own servers: the partner API sandbox on a
// free loopback port, the embedded Kafka-protocol broker, and a local
// ClickHouse server. Each starter registers its cleanup with t.Cleanup.
//
// Test environment variables are read here, and only by tests: the library
// packages read none (cmd/playpipe binds the program's flags and
// environment). These are the test run's own settings, named in the doc
// comment of the starter that reads them: PLAYPIPE_CLICKHOUSE_ADDR, _USER,
// _PASSWORD (an external server instead of a local one),
// PLAYPIPE_CLICKHOUSE_BIN (the server binary), PLAYPIPE_CLICKHOUSE_TMP (the
// parent folder of local servers' data), PLAYPIPE_REQUIRE_CLICKHOUSE=1 (fail
// instead of skipping without a binary: CI) and PLAYPIPE_TEST_LOG (the
// level of Logger).
package testenv
