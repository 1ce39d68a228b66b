// Package e2e holds playpipe's end-to-end tests that run the playpipe binary
// itself as separate OS processes against real parts: the embedded
// Kafka-protocol broker over loopback TCP (wiring/testenv), the partner API
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
// The duplicate bound asserted is the reporter's documented one
// (docs/reporter.md): a crash re-posts only reports whose answer was not on
// record — the killed reporter's posts on the wire (≤ --concurrency, 32
// here) and the answers on their way to Kafka — so at most 2 × 32; every
// duplicate is labelled in doubt (Delivery.InDoubt, counted from
// plays.deliveries with the lease markers skipped), and the audit's
// "possibly delivered twice" equals that count.
//
// PLAYPIPE_E2E_LOGDIR keeps the processes' logs in that folder.
package e2e
