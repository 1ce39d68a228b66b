// Package reporter is playpipe's delivery role: it consumes the track plays of
// <prefix>.reports in a consumer group, posts each one to the partner API
// (POST /partners/royalty-tracking, the record's exact report bytes) and
// publishes every answer to <prefix>.deliveries.
//
// What it promises:
//
//   - A partition's offset is committed only past records with a final
//     outcome (delivered or rejected) whose Delivery record is already in
//     Kafka. A crash re-sends at most the reports that were in flight or
//     final-but-uncommitted (at most one CommitInterval of them).
//   - One classifier (Classify) decides what each answer means: the outcome
//     table of DESIGN.md, with the reason for each case in the code.
//   - Transient failures are retried with exponential backoff and jitter,
//     honouring Retry-After, without holding up other reports or partitions.
//   - A 200 served by standby starts a standby episode: dispatch stops, the
//     affected offsets stay uncommitted, the API is probed with new sessions
//     until live service answers, then the standby-answered reports are
//     re-sent. Reports already final are recognised by report id.
//   - Memory is bounded whatever the backlog: at most MaxPending records are
//     held between the commit points and the newest fetched record, fetches
//     are capped at 2 MiB, and the duplicate window holds RecentWindow ids.
//   - A 403 (edge 1010) or a refused credential stops the reporter with an
//     error wrapping ErrConfiguration and commits nothing more.
//
// A Reporter runs once (Run). Run owns every goroutine it starts and returns
// only after all of them ended and the Kafka client is closed.
package reporter
