// Package e2e holds playpipe's end-to-end tests that run the playpipe binary
// itself as separate OS processes against real parts: the embedded
// Kafka-protocol broker over loopback TCP (internal/testenv), the partner API
// sandbox over HTTP and a local ClickHouse server.
//
// TestScaleOutWithFaults (issue 9, item 5) runs 3 report, 2 consume and 2
// sink processes in one broker's groups (12 partitions), kills one of each
// with SIGKILL and stops another reporter with SIGTERM while deliveries flow,
// restarts the killed ones under the same --instance-id, and then checks the
// partner's ledger against the independently expected plays, the
// duplicates against the killed reporter's --concurrency and the in-doubt
// labels, and `playpipe audit` against the partner's ledger.
//
// The duplicate bound asserted is the one issue 9 sets: duplicates at the
// partner ≤ the killed reporter's --concurrency (32 here), and at least as
// many delivered reports labelled in doubt (Delivery.InDoubt, counted from
// <prefix>.deliveries without the lease markers) as duplicates. When the
// bound fails, every duplicate is logged with its acceptance times, its
// report id and partition/offset and its Delivery records, so that a crash
// double can be told from a re-derivation. PLAYPIPE_E2E_LOGDIR=DIR keeps the
// processes' logs in DIR/<timestamp> (otherwise they live in the test's temp
// dir and their tails are printed only on failure).
//
// The tests are skipped with -short; they build the binary once per run
// (go build into the test's temp dir), which needs the go command on PATH.
package e2e
