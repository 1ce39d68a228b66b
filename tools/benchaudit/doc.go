// Command benchaudit times `playpipe audit` on synthetic ledgers of known
// content (make bench-audit; docs/audit.md, "The audit at scale").
//
// For each size it makes a fresh ledger database (Migrate), generates the
// ledger on the server with INSERT … SELECT from numbers() — events, plays
// with below-minimum ones, deliveries with doubles, doubts, rejections,
// replays, parked and pending plays in numbers fixed by the play's index
// (truth), plays carrying their event's record time (a few old rows
// without it, events recorded twice), spread over -days days — then audits the whole window and its last day and lists the
// plays delivered more than once, and checks every seeded figure, the delay's quantiles too. It
// prints the time per million plays at each size and the server's peak
// resident memory during each audit (sampled from /proc when it started
// the server itself, else the server's MemoryTracking metric). The server it
// starts keeps its data in a folder under $PLAYPIPE_CLICKHOUSE_TMP, else the
// system's temporary folder: on disk, not memory (50 M plays are about
// 12 GB). -keep keeps the ledgers and -reuse audits a kept one again
// without generating it (with -clickhouse-addr of a server left running);
// -slice-reports sets the audit's plays per slice (Limits.SliceReports).
// -chdb audits current ClickHouse in this process through chDB instead
// (a build with -tags chdb, CHDB_LIB_PATH naming libchdb.so: make chdb):
// the same ledgers and checks, in memory; its queries run one at a time
// and take no memory limit, and the peak is this process's resident set.
//
// Files: ledger.go, main.go, chdb.go (nochdb.go without the tag).
package main
