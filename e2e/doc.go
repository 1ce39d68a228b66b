// Package e2e holds playpipe's end-to-end tests that run the playpipe binary
// itself as separate OS processes against real parts: the embedded
// Kafka-protocol broker over loopback TCP (wiring/testenv), the partner API
// sandbox over HTTP and a local ClickHouse server.
//
// TestScaleOutWithFaults (issue 9, item 5) runs 3 report, 2 consume and 2
// sink processes in one Apache Kafka node's groups (12 partitions; issue 30),
// kills one of each with SIGKILL and stops another reporter with SIGTERM
// while deliveries flow, restarts the killed ones under the same
// --instance-id, kills the third reporter for good (measuring how long its
// partitions take to move after SIGTERM and after SIGKILL), and then checks the
// partner's ledger against the independently expected plays, the
// duplicates against the killed reporter's --concurrency and the in-doubt
// labels, and `playpipe audit` against the partner's ledger.
//
// The duplicate bound asserted is the reporter's documented one
// (docs/reporter.md): a crash re-posts only reports whose answer was not on
// record — the killed reporter's posts on the wire (≤ --concurrency, 32
// here) and the answers on their way to Kafka — so at most 2 × 32 per killed
// reporter (two here); every
// duplicate is labelled in doubt (Delivery.InDoubt, counted from
// plays.deliveries with the lease markers skipped), and the audit's
// "possibly delivered twice" equals that count.
//
// TestKafkaClusterFaults (issue 30, point 4) runs the pipeline as processes
// under a fleet's steady posts on three Apache Kafka brokers plus two
// controller-only nodes, through kill -9 of the busiest leader and of the
// active controller, two brokers down, a rolling restart, one broker down
// (PLAYPIPE_E2E_NODE_DOWN, 30 s by default) and one broker cut off by a
// network partition (its own network namespace, nftables dropping its
// packets; skipped, saying why, where no namespace can be made); after each
// it logs the time to resume and bounds the roles' log lines, and at the end
// checks that nothing accepted was lost and the audit covers the partner's
// duplicates. docs/kafka.md, "On Apache Kafka: what an operator sees", has
// the figures.
//
// PLAYPIPE_E2E_LOGDIR keeps the processes' logs in that folder.
package e2e
