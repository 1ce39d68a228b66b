// Package replay re-delivers reports the live reporter already handled, on an
// operator's request: `playpipe replay` (reports of a window the partner lost,
// e.g. while its standby dropped them) and `playpipe redrive` (reports the
// API rejected with 400, after a fix).
//
// A run has a replay id and a reason. It selects report ids in the ClickHouse
// ledger, reads their records from an explicit offset range of
// <prefix>.reports (found with ListOffsets by timestamp; no consumer group
// member joins, so the live reporter's group and offsets are untouched),
// posts each record's exact report bytes with partnerapi.Client.ReportPlayJSON,
// and publishes every answer to <prefix>.deliveries as a schemas.Delivery
// carrying replay_id and replay_reason (and no lease marker nor
// playpipe-src header: the live reporter's recovery ignores these records).
// The audit lists such deliveries per replay and never counts them as a
// report delivered more than once.
//
// `playpipe redrive --parked` posts nothing itself: a parked report has one
// poster, the slow lane of the reporter that owns its partition. The run
// writes a schemas.RedriveRequest per report to <prefix>.parked and waits
// (Config.OwnerWait) for the owner to post it — the Delivery record
// carrying the run's replay id and reason — and remove the request
// (parked.go). An interrupted run's requests are still served, once.
//
// Idempotent re-runs: the run records its start time in the offset-commit
// metadata of its own consumer group (playpipe-replay.<replay id>); a re-run
// of the same id reads <prefix>.deliveries from that time and skips every
// report that id already got a final answer for (delivered or rejected),
// besides those the ledger already shows. A report is done only when its
// Delivery record is acknowledged by Kafka; a crash between a post and that
// acknowledgement re-posts the report on the re-run, labelled in_doubt; a
// run that was interrupted (every post it made on record) records that it
// stopped, and the re-run labels nothing.
package replay
