// Package chcluster runs a replicated ClickHouse on one machine for tests:
// Debian's ZooKeeper (3.8, package zookeeper: its Java main run with a
// generated zoo.cfg in a folder of the caller's, on a free loopback port,
// never the system service) and clickhouse-server processes as the
// replicas of a 1-shard cluster (internal/chlocal, each with a config.d
// naming the cluster's remote_servers, its {shard}/{replica} macros, the
// ZooKeeper node and distributed_ddl).
//
// Readiness is strict, because ZooKeeper answers `ruok` before it serves
// sessions and a clickhouse-server 18.16 started in that window crashes on
// its next ON CLUSTER statement (a segfault in
// zkutil::ZooKeeper::createImpl): Start waits until ZooKeeper's `srvr`
// reports its mode (it serves), starts the replicas only then, and returns
// once system.zookeeper answers on every replica and a probe statement ON
// CLUSTER has run on all of them (a DDL worker that stopped makes every ON
// CLUSTER statement wait 180 s with no word why). Restart waits for
// system.zookeeper the same way for a killed replica.
//
// Used by testkit/testenv (StartClickHouseCluster) and the e2e suite's
// replicated-ledger test; docs/audit.md, "A replicated ledger", describes
// the layout it builds.
package chcluster
