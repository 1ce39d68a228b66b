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
//     table of DESIGN.md, with the reason for each case in the code.
//   - Transient failures are retried with exponential backoff and jitter,
//     honouring Retry-After, without holding up other reports or partitions.
//   - A 200 served by standby starts a standby episode: posting stops, the
//     affected offsets stay uncommitted, the API is probed with new sessions
//     until live service answers, then the standby-answered reports are
//     re-sent. Reports already final are recognised by report id.
//   - Memory is bounded whatever the backlog: at most MaxPending records are
//     held between the commit points and the newest fetched record, fetches
//     are capped at 2 MiB, and the duplicate window holds RecentWindow ids.
//   - A 403 (edge 1010) or a refused credential stops the reporter with an
//     error wrapping ErrInvalidConfig and commits nothing more.
//
// Files by concern: reporter.go (types, Run), intake.go (polling, intake,
// topics), lease.go (lease markers), dispatch.go (workers, posts, Delivery
// records), outcome.go (applying answers), classify.go (what an answer
// means), commit.go and progress.go (commits and their metadata),
// recover.go (assignment), revoke.go (rebalances), standby.go (standby
// episodes), throttle.go (the retry budget), limit.go (the adaptive
// in-flight limit), lifecycle.go (coordinator, shutdown), clock.go (the
// injected clock).
//
// # State and locks
//
// A Run's goroutines: the poller (intake), the leaser, MaxConcurrency
// workers, the coordinator (timers, commits, revocations, shutdown), a
// periodic commit's goroutine, a standby episode's prober, and the Kafka
// client's produce and group callbacks.
//
// Owned without the shared lock:
//   - the fetch bound: run.pending (atomic) and run.room (the poller
//     waits on it);
//   - the periodic commits' pace (commitPace) and the retry, commit and
//     shutdown timers: the coordinator goroutine's;
//   - the revocation list: the coordinator's (the others read
//     run.revoking, an atomic);
//   - a post under way (the job's attempt, decision, latency and trace id,
//     and its Delivery record): the worker's, from next to its answer;
//   - a standby episode's timer and probe count: the prober's.
//
// One lock, run.mu, guards the state a report moves through: workerState,
// queueState, answerState, standbyState, stopState (reporter.go), every
// partState and every job outside a post. They are grouped by concern, but
// share the lock because each of these steps must be atomic across the
// concerns:
//
//  1. Intake (poller, intake): a fetched record enters its partition's
//     tracker and a queue, or is final at once (recovered, below minimum).
//  2. Lease (leaser, takeLease): a queued report passes the duplicate
//     window and the active reports, and joins its partition's unsure set
//     before its marker is produced: a commit in between carries it.
//  3. Marker acknowledged (leaseAcked): logEnd moves and the reports
//     become postable in one step.
//  4. Post start (next): a leased report goes in flight after the checks
//     of stopping, the standby episode, its partition's revocation, the
//     in-flight limit, the retry budget and the cap on posts at stake, and
//     is counted (inflight, unacked, unsure) in the same step: no post
//     starts past a cap, during an episode or after a stop, and no commit
//     misses it. The throttle (limit and budget) therefore has no lock of
//     its own: two workers could both take the last slot.
//  5. Answer (posted): in flight → retry queue, standby hold or final
//     awaiting its record, with the budget, the limit and the duplicate
//     window.
//  6. Answer recorded (produce callbacks: persisted, answerAcked,
//     recorded): logEnd moves together with the change the record makes
//     (final in the tracker, doubt cleared). A snapshot that saw the log
//     position without the change would make the next owner skip that
//     record of the log tail and post a final report again.
//  7. Progress snapshot (progressOf, dirtyProgress): the tracker, the
//     unsure set, the recovered states and logEnd are read together.
//  8. Revocation done (checkRevocations): the partition's posts are back,
//     its progress is taken and its state dropped.
//
// Lock order: run.mu is the only lock of a Run and nothing else is locked
// while it is held (idle workers wait on run.cond, which is on run.mu).
// Under it: channel sends that never block (wake-ups, a revocation's
// reply), cond signals, atomics, metrics, logs. Never under it: calls into
// the Kafka client (its produce callbacks take run.mu), posts, commits,
// the rate limit's waits.
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
