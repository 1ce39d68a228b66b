//go:build linux

// Command bench is the end-to-end benchmark of the pipeline as users run it
// (`make bench-e2e`): every role a separate process of the built binary.
//
// It starts the embedded Kafka broker (kfake, in this process, over TCP),
// a local ClickHouse server, `playpipe sandbox --lean` as the partner API,
// and the `sink`, `consume` and `report` roles as processes; then
// `playpipe simulate` publishes --events player events as fast as the broker
// takes them. The run ends when every event is consumed, every derived play
// has a final answer from the partner, and every delivery is in the
// ClickHouse ledger. It prints plays/s end to end, CPU µs per play per
// process (/proc/<pid>/stat utime+stime deltas over the run) and peak RSS
// per process (/proc/<pid>/status VmHWM). The bench process's own row is
// the broker's work plus its polling of the roles' metrics (every 25 ms).
//
// Then, in the same run, the raw HTTP ceiling: a plain net/http client with
// keep-alive posts the very report bodies the reporter posted (read back
// from the reports topic, byte for byte) to the same sandbox process with
// the same number in flight (--concurrency), after the sandbox's ledger is
// reset (so that they are not answered as duplicates). The ratio
// pipeline/ceiling is the share of the partner path's capacity the whole
// pipeline reaches.
//
// Each run first pushes -warmup events (twice -events by default, at least
// 120 000; other seeds) through the same roles, unmeasured, in
// -warmup-rounds rounds (3): a fresh Apache Kafka JVM spends about half its
// CPU compiling for tens of seconds, its compiler still takes a share of
// every play for minutes, and each round's start (a new publisher) made it
// throw away code it had compiled and compile it again, less at every
// round. Kafka's own tools run once unmeasured before the floor is
// measured, for the same reason. It then prints each
// role's Kafka traffic per play (records written and read, produce and fetch
// requests, transaction ends, commits, the mean wait of an acknowledgement:
// the roles' playpipe_kafka_* metrics, franz-go hooks), the broker's CPU by
// thread and with the pipeline idle, when each stage was done, and the
// reporter's gauges over its backlog. -kafka both (`make bench-e2e`) runs
// kfake, then Apache Kafka and Kafka's own ProducerPerformance and
// ConsumerPerformance on its node (floor.go): the broker's CPU per play
// against the floor those tools measure, side by side (both.go). On Apache
// Kafka, -broker-profile records the broker JVM with Java Flight Recorder
// over the measured round and prints its request threads' CPU per play by
// Kafka API (jfr.go): which requests the broker's work per play goes to.
// -report-profile writes a CPU profile of the reporter's first 5 s of each
// measured round, on either broker.
//
// It is a program under tools/ rather than a `playpipe bench`
// subcommand: it is a development tool that needs a source tree (it runs the
// binary `make build` made, and embeds the test broker), and it must not
// ship in the production binary or image.
//
// With -mode report (`make bench-report`) it measures the reporter alone
// as a process against the plain client: see runReportBench. With -mode
// latency (`make bench-report-latency`) the sandbox answers after each of
// -latencies (and, with -error-rates, answers that share of the posts 500)
// and the reporter runs with its default flags: see runLatencyBench.
//
//	make bench-e2e                              # -kafka both; defaults: 40000 events, 48 in flight (playpipe report's default)
//	go run ./tools/bench -events 20000 -kafka both -rounds 2
//	go run ./tools/bench -bin bin/playpipe -events 80000 -keep
//	go run ./tools/bench -events 20000 -kafka apache -broker-profile /tmp/broker   # + /tmp/broker.<hhmmss>.jfr
//	make bench-report                           # -mode report -reports 100000 -rounds 3
//	make bench-report-latency                   # -mode latency: 0, 5, 50, 150 ms partner, reporter with default flags
//	make bench-report-errors                    # -mode latency at 50, 150 ms with 0, 0.1, 1, 2 % of posts answered 500, a poison track, a hanging track, 1 % of posts held at random
//
// Files: bench.go, both.go, ceiling.go, faults.go, floor.go, jfr.go,
// latencymode.go, main.go, proc.go, report.go, reportmode.go, wire.go. Tests:
// bench_test.go, faults_test.go, jfr_test.go.
package main
