// Package testenv starts the real parts that playpipe's tests run against, so
// that no test file hand-rolls its own servers. Each starter registers its
// cleanup with t.Cleanup; a part that is not installed skips the test, saying
// how to install it, unless the run requires it (PLAYPIPE_REQUIRE_*=1, as
// `make test` and CI set), which makes that a failure.
//
// Files by part:
//
//   - kafka.go: Kafka, the broker of one test, and StartKafka, the embedded
//     Kafka-protocol broker (kfake) on loopback, with readers of a topic to
//     its end (committed or not) for the tests' counts.
//   - apachekafka.go: Apache Kafka itself — StartApacheKafka starts KRaft
//     nodes as JVM processes from the jars `make kafka` resolves
//     (testkit/kafkanode): one combined node, or a three-node cluster
//     (replication factor 3, min.insync.replicas 2) with optional
//     controller-only nodes, nodes on their own addresses or under a command
//     (a network namespace), to be stopped, killed, frozen and restarted;
//     SharedApacheKafka is one node per test binary with fresh topics per
//     test, for the tests that never stop their broker; WaitInSync waits for
//     every partition's replicas.
//   - clickhouse.go: StartClickHouse, a local clickhouse-server per test
//     (internal/chlocal; Debian's 18.16 here), or an external server named by
//     the environment; Stop and Restart for the outage tests.
//   - cluster.go: StartClickHouseCluster, a replicated ledger — Debian's
//     ZooKeeper and two clickhouse-server replicas of a one-shard cluster
//     (testkit/chcluster) in a temporary folder.
//   - ledger.go, ledger_chdb.go: ForEachLedger runs a ledger test once per
//     ClickHouse: clickhouse-server always, and current ClickHouse in-process
//     through chdb (testkit/chdbconn) in test binaries built with -tags chdb
//     (`make test-chdb`).
//   - sandbox.go: StartSandbox, the partner API sandbox on a free loopback
//     port; ServeHandler serves any handler the same way.
//   - latepartner.go: LatePartner, a partner that records a report at once
//     but answers late (the slow-partner tests).
//   - procs.go: the process harness of the end-to-end suites —
//     BuildPlaypipe builds the binary into the test's folder, ChildEnv is the
//     environment of a child, Procs starts, signals, waits for and stops
//     children by PID with a log file each (DumpLogs on failure), WaitReady
//     polls a role's /readyz, ScrapeSum sums a metric of /metrics, GrepLog
//     reads a log.
//   - freeaddr.go: FreeAddr, a free loopback port for a child to bind, in
//     20000–32767 (below the ephemeral range, so an outgoing connection
//     cannot take it first), never handed out twice in one test binary.
//   - log.go: Logger, a slog.Logger into the test's log.
//
// Test environment variables are read here, and only by tests: the library
// packages read none (cmd/playpipe binds the program's flags and
// environment). These are the test run's own settings, named in the doc
// comment of the starter that reads them: PLAYPIPE_CLICKHOUSE_ADDR, _USER,
// _PASSWORD (an external server instead of a local one),
// PLAYPIPE_CLICKHOUSE_BIN (the server binary), PLAYPIPE_CLICKHOUSE_TMP (the
// parent folder of local servers' data), PLAYPIPE_REQUIRE_CLICKHOUSE=1 (fail
// instead of skipping without a ClickHouse binary or ZooKeeper),
// PLAYPIPE_KAFKA_VERSION (the Apache Kafka release, 4.1.0 by default),
// PLAYPIPE_REQUIRE_KAFKA=1 (fail instead of skipping without its jars or
// java) and PLAYPIPE_TEST_LOG (the level of Logger).
package testenv
