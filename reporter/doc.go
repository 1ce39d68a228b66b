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
// in-flight limit), lifecycle.go (coordinator, shutdown).
//
// A Reporter runs once (Run). Run owns every goroutine it starts and returns
// only after all of them ended and the Kafka client is closed.
package reporter
