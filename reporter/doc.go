// Package reporter is playpipe's delivery role: it consumes the track plays of
// <prefix>.reports in a consumer group, posts each one to the partner API
// (POST /partners/royalty-tracking, the record's exact report bytes) and
// publishes every answer to <prefix>.deliveries.
//
// What it promises:
//
//   - A report whose final outcome (delivered or rejected) Kafka has
//     acknowledged in <prefix>.deliveries is never posted again, after any
//     stop, crash, rebalance or scale-out: each offset commit carries the
//     partition's progress in its metadata (progress.go), reports are posted
//     only after a lease marker naming them is in the deliveries log
//     (lease.go), and a partition's new owner recovers from both
//     (recover.go). A partition leases only within the window its progress
//     can hold in MetadataMaxBytes, so every commit fits at any in-flight.
//   - A graceful stop (Run's ctx ends) waits for the posts in flight within
//     ShutdownTimeout and commits every partition's progress: the next run
//     posts each pending report once. A crash re-posts at most the reports
//     whose answer was not recorded, each labelled InDoubt in its Delivery.
//   - A partition's offset is committed only past records with a final
//     outcome whose Delivery record is already in Kafka.
//   - One classifier (Classify) decides what each answer means: the outcome
//     table of docs/design.md, with the reason for each case in the code.
//   - Transient failures are retried with exponential backoff and jitter,
//     honouring Retry-After, without holding up other reports or partitions.
//   - A 200 served by standby starts a standby episode: posting stops, the
//     affected offsets stay uncommitted, the API is probed with new sessions
//     until live service answers, then the standby-answered reports are
//     re-sent. Reports already final are recognised by report id.
//   - A report whose transient failures outlast its retry budget
//     (ParkAfterAttempts and ParkAfter, counted while other reports are
//     answered) is parked: its state is written to <prefix>.parked, a parked
//     Delivery record settles its offset (the commit point moves on), and a
//     slow lane retries it on ParkRetries until it is final (park.go,
//     slowlane.go, slowretry.go), holding only its id, due time and entry
//     offset: the body is read back from <prefix>.parked when it is due
//     (slowread.go). An outage of the whole partner parks nothing. The slow lane is a parked report's one poster: `redrive
//     --parked` asks it (redrive.go), a revocation waits for its slow
//     retries, and its writes of parked state go through the partition's
//     transactional fence, claimed by each new owner before it reads the
//     entries (parkfence.go): an owner that lost the partition unawares
//     writes nothing after its successor. Nothing a slow retry meets stops
//     the run but a refused credential.
//   - A payload the partner fails or hangs on (until the API timeout) while
//     it answers the others is told from an overloaded partner: its
//     failures never collapse the in-flight limit, its retries hold at most
//     a quarter of it, and its hanging posts leave the limit's count once
//     stalled (limit.go); the fresh reports of a track whose posts stall
//     hold at most a small share of the slots and wait aside over it
//     (suspect.go), so a hanging track never fills MaxConcurrency; once
//     the track's own budget is spent its reports waiting are parked
//     without another post (parkhang.go), the posts out at their failure; a set
//     of reports failing repeatedly is warned of within seconds, and Ready
//     says degraded while nothing is delivered (stall.go).
//   - Memory is bounded whatever the backlog: at most about MaxPending
//     records per partition are held between its commit point and its newest
//     fetched record (fetching pauses for that partition alone), fetches are
//     capped at 2 MiB, and the duplicate window holds RecentWindow ids.
//   - A 403 (edge 1010) or a refused credential stops the reporter with an
//     error wrapping ErrInvalidConfig and commits nothing more.
//
// Files by concern: config.go (Config, its defaults and Validate),
// reporter.go (types, Run), intake.go (polling, intake, topics), queue.go
// (the dispatch queues), lease.go (lease markers), dispatch.go (workers,
// posts), produce.go (the one way records leave the reporter;
// produce_benchstub.go swaps it in the benchstub measurement build),
// producers.go (the Kafka clients that write them, each partition through
// one),
// outcome.go (applying answers), backoff.go (the retry delay), dedupe.go (the recent report ids),
// watermark.go (a partition's safe commit offset), commit.go and
// progress.go (commits and their metadata), recover.go (assignment),
// revoke.go (rebalances), park.go, slowlane.go, slowretry.go, slowread.go, pausefence.go,
// parkfence.go, parkedtopic.go and redrive.go (parking, slow retries, the parked topic,
// operators' redrive requests), standby.go (standby episodes),
// throttle.go (the retry budget), limit.go (the adaptive in-flight limit),
// suspect.go (suspect tracks: the share of a hanging track's fresh reports),
// parkhang.go (a hanging track's waiting reports parked without a post),
// stall.go (the stall warning and readiness), lifecycle.go (coordinator,
// shutdown), metrics.go (instruments and gauges), clock.go (the injected
// clock). What an answer means (Classify) and what a post's Delivery
// record says (Attempt, Doubt, New) live in the package reporter/delivery,
// which playpipe replay and redrive use too.
//
// # State and locks
//
// A Run's goroutines: the poller (intake), the leaser, MaxConcurrency
// workers, the slow lane and its slow retries (slowConcurrency at most),
// the coordinator (timers, commits, revocations, shutdown), a
// periodic commit's goroutine, a standby episode's prober, and the Kafka
// client's produce and group callbacks.
//
// Each concern owns its state and its lock (or its goroutine):
//
//   - Partitions (partState.mu, one per assigned partition): the report's
//     way from intake to commit, the one invariant that needs a lock across
//     steps. The tracker (which offsets are final), the unsure set (reports
//     that may be at the partner without a recorded answer), the recovered
//     states, the log position (logEnd), the posts out (inflight) and the
//     reports held past the window. Every step that changes what a commit
//     would say takes it: intake, a report joining the unsure set before
//     its lease marker is produced, a post starting (checked against the
//     partition's revocation and counted in the same step), an answer's
//     record acknowledged (the log position moves together with the change
//     the record makes: a snapshot that saw one without the other would
//     make the next owner skip that record of the log tail and post a final
//     report again), and the progress snapshot (progressOf), which reads it
//     all together. Each partition's progress is independent of the
//     others', so no step locks two partitions.
//   - Dispatch (run.mu): the queues (fresh, ready, delayed, leased), the
//     leases on their way, the workers (idle ones wait on run.cond), the
//     posts in flight and the answers not recorded (the cap on posts at
//     stake), the throttle (in-flight limit and retry budget, decided with
//     the in-flight count: no lock of their own, so two workers cannot both
//     take the last slot) and the standby episode, which holds the dispatch.
//   - Report ids (run.idMu): the reports on their way by id, each one's
//     followers (twins waiting for its outcome), and the ids already final
//     (the duplicate window).
//   - The partition map (run.partsMu), the commits' memory
//     (commitState.mu), the first fatal error (run.fatalMu): leaves.
//   - The stop: run.stopping and run.noCommit are atomics, set once; a post
//     starts only after next read stopping under run.mu, and the
//     coordinator ends the run only when it reads stopping and then no post
//     in flight under run.mu.
//   - The coordinator's own, without a lock: the periodic commits' pace
//     (commitPace), the retry, commit and shutdown timers, the revocation
//     list (the others read run.revoking, an atomic).
//   - A post under way (the job's attempt, decision, latency and trace id,
//     and its Delivery record): the worker's, from next to its answer; a
//     standby episode's timer and probe count: the prober's; the fetch
//     bound: run.pending (atomic) and run.room.
//
// Lock order: run.mu, then run.idMu, then a partState.mu; the leaves last.
// Code that starts at a partition (intake, an acknowledged record) releases
// its lock before it takes run.mu or run.idMu: it returns the reports a
// moved commit point lets back in (markDone, unheld) and queues them after
// (pushReady, requeue). Each function's comment says which lock it needs.
// Under a lock: channel sends that never block (wake-ups, a revocation's
// reply), cond signals, atomics, metrics, logs. Never under one: calls into
// the Kafka client (its produce callbacks take these locks), posts,
// commits, the rate limit's waits.
//
// Between the steps, a report is seen in one state by one concern and in
// the next by another for a moment; each such moment is safe because the
// partition's state errs toward doubt: a report joins the unsure set before
// anything could post it and leaves it only once its answer is on record,
// so a snapshot taken in between over-counts reports in doubt (the audit's
// bound stays above the partner's duplicates) and never marks one final
// that is not.
//
// # Time
//
// Every timer of a Run and every reading of the time it acts on goes
// through Config.Clock (clock.go): tests advance a fake clock instead of
// sleeping. A post's latency is the partner client's measurement (real
// time), and waits on the broker stay real.
//
// A Reporter runs once (Run). Run owns every goroutine it starts and returns
// only after all of them ended and the Kafka client is closed.
package reporter
