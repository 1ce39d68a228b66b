// Package kafkanode runs Apache Kafka itself, in KRaft mode, as child JVM
// processes on loopback: one combined broker+controller node, or a cluster of
// several combined nodes that vote in one controller quorum. The tests and
// the bench use it so that every promise that depends on the broker is proven
// on the broker users run, not only on the in-process fake (kfake).
//
// The jars are Apache Kafka's own release artifacts
// (org.apache.kafka:kafka_2.13 and its runtime dependencies), resolved from
// Maven Central by `make kafka` into .playpipe/kafka/<version>/libs
// (deploy/kafka/pom.xml); FindInstall locates them and reports
// ErrNotInstalled with that command when they are missing. Nothing is
// downloaded here.
//
// Start formats each node's storage with Kafka's own storage tool
// (kafka.tools.StorageTool format, one cluster id for all nodes, static
// controller.quorum.voters: the same on Kafka 3.9 and 4.x), starts kafka.Kafka
// per node and waits until the admin API lists every broker. A failed start
// returns a *StartError with the tail of each node's log.
//
// A Node can be stopped (SIGTERM, a controlled shutdown, then SIGKILL when the
// context ends), killed (SIGKILL), frozen (SIGSTOP) and thawed, and started
// again on the same folder and ports: its log is kept, as a broker's disk
// is. Children are started in their own process group with a parent-death
// signal, so a crashed test leaves no JVM behind. Cluster and Node are safe
// for concurrent use.
//
// PLAYPIPE_KAFKA_JVM_OPTS adds java flags to every JVM the package starts
// (each node and its storage tool; split on spaces), for a diagnosis:
// "-XX:+UnlockDiagnosticVMOptions -XX:+PrintCompilation -XX:+LogVMOutput
// -XX:LogFile=/tmp/jit-%p.log" logs what a node's JIT compiler does, with
// the milliseconds since the JVM's start.
package kafkanode
