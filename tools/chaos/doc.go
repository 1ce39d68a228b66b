//go:build linux

// Command chaos runs the whole pipeline as processes — a three-node Apache
// Kafka cluster (replication 3, min.insync.replicas 2; node 3 in a network
// namespace), ClickHouse, the partner sandbox behind nginx, two consume,
// two report and one sink and the ingest gateway under a supervisor — with
// a fleet publishing at a steady rate, through a seeded random schedule of
// overlapping faults, then lifts them, drains, and judges the outcome play
// by play against the partner's ledger and the audit. `make chaos`;
// docs/chaos.md.
//
// Files: faults.go, fleet.go, main.go, report.go, rig.go, schedule.go,
// super.go, verdict.go. Tests: schedule_test.go. Node 3's namespace and the
// partition come from testkit/netns, nginx and its certificates from
// testkit/tlsedge, shared with the e2e suites.
package main
