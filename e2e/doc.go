// Package e2e holds playpipe's end-to-end tests: each builds the playpipe
// binary and runs the roles as separate OS processes against real parts
// started by testkit/testenv — Apache Kafka (KRaft nodes from `make kafka`'s
// jars, one node or a three-broker cluster), or the embedded Kafka-protocol
// broker as a process of its own (`playpipe broker`, so that a test can
// freeze or kill the broker alone), the partner API sandbox over HTTP, and a
// local ClickHouse server (or a replicated pair with ZooKeeper). Every test
// counts what the partner received, play by play, against the plays expected
// from what the fleet published (testkit/expect), and holds the partner's
// duplicates to the posts labelled in doubt and the audit's bound.
//
// The tests, by file:
//
//   - scaleout_test.go, TestScaleOutWithFaults: 3 report, 2 consume and 2
//     sink processes on one Apache Kafka node (12 partitions); one of each
//     killed with SIGKILL and another reporter stopped with SIGTERM while
//     deliveries flow, the killed ones restarted under the same
//     --instance-id, the third reporter killed for good (measuring how long
//     its partitions take to move after SIGTERM and after SIGKILL). The
//     duplicate bound asserted is the reporter's documented one
//     (docs/reporter.md): a crash re-posts only reports whose answer was not
//     on record — the killed reporter's posts on the wire (≤ --concurrency,
//     32 here) and the answers on their way to Kafka — so at most 2 × 32 per
//     killed reporter; every duplicate is labelled in doubt
//     (Delivery.InDoubt, counted from plays.deliveries with the lease
//     markers skipped), and the audit's "possibly delivered twice" equals
//     that count.
//   - slowpartner_test.go, TestSlowPartnerCopiesAsProcesses: on Apache
//     Kafka, a partner that records each report but answers its first two
//     posts after the reporter's --api-timeout; the audit must bound the
//     partner's extra copies copy by copy and name the cause.
//   - park_test.go, TestPoisonTrackParked: on Apache Kafka, a partner that
//     answers 500 to every report of one track; the others are delivered,
//     the track's reports parked and listed by `playpipe audit --list
//     parked`, then delivered once by `playpipe redrive --parked`.
//   - hang_test.go, TestHangingTrackParked: on Apache Kafka, a partner
//     that holds every report of one track past the reporter's
//     --api-timeout; the other reports flow at the baseline's rate, the
//     reporter warns of the stall, parks the held reports with reason
//     timeout (listed by the audit) and never exits; after the fault is
//     lifted each is at the partner exactly once. alerts_test.go evaluates
//     the shipped alert rules (deploy/prometheus/alerts.yaml) with
//     `promtool test rules` on that reporter's real /metrics.
//   - redrive_test.go, TestRedriveOnePoster: on Apache Kafka, `playpipe
//     redrive --parked` racing the reporter's due slow retries, killed with
//     SIGKILL and with SIGTERM, then re-run: the partition's owner is the
//     one poster, so the partner holds every play and no more copies than
//     the audit's bound.
//   - parkowners_test.go, TestParkedRevocationMidSlowRetry,
//     TestParkedOwnerKilledMidSlowRetry and TestParkedOwnerPausedPastSession:
//     on Apache Kafka, reporters joining and stopped with SIGTERM while
//     the slow lane's posts are held by the partner and while they
//     deliver; the owner killed with SIGKILL with its slow retries' posts
//     held, restarted, then killed again as the partner accepts them and
//     taken over by another instance; the owner paused (SIGSTOP) past its
//     session with its posts held, its partitions delivered by another,
//     then resumed. The partner
//     holds every play, no more copies than the audit's bound, and no
//     parked report's last state in <prefix>.parked is an entry.
//     parkrig_test.go is the rig these and the park, hang and redrive
//     tests share (startParkRig).
//   - kafkacluster_test.go, TestKafkaClusterFaults: the pipeline as
//     processes (ingest, consume, report ×2, sink) under a fleet's steady
//     posts on three Apache Kafka brokers plus two controller-only nodes
//     (replication factor 3, min.insync.replicas 2), through kill -9 of the
//     busiest leader and of the active controller, two brokers down (the
//     enrich role's transaction coordinator among them: every writing
//     role's /readyz 503, NOT_ENOUGH_REPLICAS), a rolling restart,
//     one broker down (PLAYPIPE_E2E_NODE_DOWN, 30 s by default) and one
//     broker cut off by a network partition (its own network namespace,
//     nftables dropping its packets: needs root, nft and ip; skipped, saying
//     why, where no namespace can be made). After each fault it logs the time
//     to resume and bounds the roles' log lines; at the end nothing accepted
//     may be lost and the audit must cover the partner's duplicates.
//     docs/kafka.md, "On Apache Kafka: what an operator sees", has the
//     figures. The rig alone takes minutes to start and run.
//   - brokerfaults_test.go (on the rig of brokerrig_test.go):
//     TestBrokerFrozen (the embedded broker's process frozen with SIGSTOP
//     past the gateway's --delivery-timeout: 503 with each event's fate,
//     /readyz naming the broker, nothing accepted lost),
//     TestBrokerRestartedEmpty (the broker killed and started again empty:
//     the roles exit 75 for their supervisor, the test's loop, and resume),
//     TestBrokerFrozenShutdown (SIGTERM to every role while the broker is
//     frozen: each exits 0 within its bound) and TestTopicRecreated (on
//     Apache Kafka: plays.events deleted and created again; the roles exit
//     75, and the audit counts both topic generations once each).
//   - replayfrozen_test.go, TestReplayBrokerFrozen: `playpipe replay` as a
//     process with the broker frozen mid-run: it ends within its
//     --kafka-timeout with an error that says how to resume, and a re-run of
//     the same replay id finishes the job without re-posting a report whose
//     final answer is on record.
//   - cluster_test.go, TestReplicatedLedgerWithKills: the ledger on two
//     clickhouse-server replicas with ZooKeeper (`playpipe migrate
//     --cluster`), the embedded broker in the test process; one replica and
//     then the sink killed with SIGKILL mid-insert, both restarted; the audit
//     through each replica alone must equal the partner's ledger.
//   - expect_test.go and diag_test.go are helpers: the expected plays of
//     `playpipe simulate --record`, and an explanation of every duplicate
//     (when it arrived, its report ids, their Delivery records) logged when
//     a count fails.
//
// The edge suite (nginx in front of the sandbox) is the sub-package
// e2e/edge; the suite on Docker containers is e2e/docker (build tag
// docker, `make e2e-docker`).
//
// These tests skip under -short. Without Apache Kafka's jars, ClickHouse or
// ZooKeeper they skip, unless PLAYPIPE_REQUIRE_KAFKA=1 and
// PLAYPIPE_REQUIRE_CLICKHOUSE=1 (`make test`, which installs them) make that
// a failure. PLAYPIPE_E2E_LOGDIR keeps the processes' logs in that folder.
package e2e
