package analytics

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/schemas"
)

// Per-report state (docs/audit.md, "The audit at scale").
//
// report_state holds, per report id, the outcome states of its Delivery
// records: kept up to date by the materialized view report_state_mv as the
// sink inserts into deliveries, and built from an existing ledger by the
// backfill. The audit no longer reads it (merging its uniqExact states cost
// more than grouping the raw records with cheap states: audit_sliced.go);
// migration 7 and the backfill keep it until a later migration drops or
// reshapes it.
//
// Every state is idempotent: distinct record locations (uniqExact), min,
// max, any. A row counted twice — a sink's batch inserted again after a
// crash, a backfill batch overlapping the view's inserts, a backfill batch
// run again after an interruption — changes no figure. That is what lets
// the backfill run while the sink writes, in any order, resumed anywhere.

// TableReportState and TableBackfills are the per-report state and the
// record of the backfill's progress.
const (
	TableReportState = "report_state"
	TableBackfills   = "backfills"
	reportStateView  = "report_state_mv"
)

// stateSuffix ends the names of report_state's state columns (an alias
// never shadows the column its -Merge reads).
const stateSuffix = "_s"

// reportLoc is one Delivery record's location as one number: a report's
// records are counted distinct by it (within one report's few records a
// 64-bit hash does not collide).
const reportLoc = "cityHash64(kafka_topic_id, toString(kafka_topic), kafka_partition, kafka_offset)"

// reportStateColumns are report_state's state columns (named name_s):
// name, type, the -State expression over a deliveries row that feeds it,
// and the -Merge function whose read gives perReport's column name
// (stateOutcomes).
var reportStateColumns = []struct{ name, typ, state, merge string }{
	{"delivered_n", "AggregateFunction(uniqExactIf, UInt64, UInt8)", "uniqExactIfState(" + reportLoc + ", outcome = 'delivered' AND replay_id = '')", "uniqExactIfMerge"},
	{"replay_delivered_n", "AggregateFunction(uniqExactIf, UInt64, UInt8)", "uniqExactIfState(" + reportLoc + ", outcome = 'delivered' AND replay_id != '')", "uniqExactIfMerge"},
	{"rejected_n", "AggregateFunction(max, UInt8)", "maxState(toUInt8(outcome = 'rejected'))", "maxMerge"},
	{"standby_n", "AggregateFunction(max, UInt8)", "maxState(toUInt8(outcome = 'standby'))", "maxMerge"},
	{"parked_n", "AggregateFunction(max, UInt8)", "maxState(toUInt8(outcome = '" + schemas.OutcomeParked + "'))", "maxMerge"},
	{"doubt_delivered", "AggregateFunction(maxIf, UInt8, UInt8)", "maxIfState(in_doubt, outcome = 'delivered' AND replay_id = '')", "maxIfMerge"},
	{"doubt_n", "AggregateFunction(uniqExactIf, UInt64, UInt8)", "uniqExactIfState(" + reportLoc + ", doubt_cause != '' AND replay_id = '')", "uniqExactIfMerge"},
	{"replay_doubt_n", "AggregateFunction(uniqExactIf, UInt64, UInt8)", "uniqExactIfState(" + reportLoc + ", doubt_cause != '' AND replay_id != '')", "uniqExactIfMerge"},
	{"delivered_ms", "AggregateFunction(minIf, Int64, UInt8)", "minIfState(at_ms, outcome = 'delivered')", "minIfMerge"},
	{"replayed", "AggregateFunction(max, UInt8)", "maxState(toUInt8(replay_id != ''))", "maxMerge"},
	{"reject_message", "AggregateFunction(anyIf, String, UInt8)", "anyIfState(message, outcome = 'rejected')", "anyIfMerge"},
}

// reportStateTable is report_state's DDL (a ledger CREATE: on a cluster it
// becomes a replicated report_state_local and a Distributed report_state).
func reportStateTable() string {
	cols := []string{"    report_id String"}
	for _, c := range reportStateColumns {
		cols = append(cols, "    "+c.name+stateSuffix+" "+c.typ)
	}
	return "CREATE TABLE IF NOT EXISTS {db}." + TableReportState + " (\n" + strings.Join(cols, ",\n") + "\n) ENGINE = AggregatingMergeTree\nORDER BY report_id"
}

// reportStateSelect is the SELECT of report_state's rows from the deliveries
// table from (qualified), with an optional extra condition.
func reportStateSelect(from, where string) string {
	exprs := []string{"report_id"}
	for _, c := range reportStateColumns {
		exprs = append(exprs, c.state+" AS "+c.name+stateSuffix)
	}
	if where != "" {
		where = " WHERE " + where
	}
	return "SELECT " + strings.Join(exprs, ", ") + " FROM " + from + where + " GROUP BY report_id"
}

// reportStateColumnList is report_state's columns, comma separated (every
// INSERT names its columns).
func reportStateColumnList() string {
	names := []string{"report_id"}
	for _, c := range reportStateColumns {
		names = append(names, c.name+stateSuffix)
	}
	return strings.Join(names, ", ")
}

// reportStateStatements are migration 7's statements: the state table, the
// table of backfill progress, and the view that feeds the state from every
// insert into deliveries (created last: the backfill covers what was there
// before it, overlaps harmlessly with what it sees).
func reportStateStatements() []string {
	return []string{
		reportStateTable(),
		"CREATE TABLE IF NOT EXISTS {db}." + TableBackfills + ` (
    name String,
    slice String,
    done_at DateTime
) ENGINE = ReplacingMergeTree
ORDER BY (name, slice)`,
		"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}." + reportStateView + " TO {db}." + TableReportState + " AS " +
			reportStateSelect("{db}.deliveries", ""),
	}
}

// viewClusterStatement is the cluster form of the view: on every replica,
// from its deliveries_local into its report_state_local (a replica's view
// sees the inserts made on that replica; the state table replicates what
// it writes).
func viewClusterStatement(st, cluster string) (string, bool) {
	prefix := "CREATE MATERIALIZED VIEW IF NOT EXISTS {db}." + reportStateView + " TO {db}." + TableReportState + " AS "
	if !strings.HasPrefix(st, prefix) {
		return "", false
	}
	return "CREATE MATERIALIZED VIEW IF NOT EXISTS {db}." + reportStateView + " ON CLUSTER " + cluster +
		" TO {db}." + TableReportState + LocalSuffix + " AS " + reportStateSelect("{db}.deliveries"+LocalSuffix, ""), true
}

// Report ids are 32 hex digits (schemas.ReportID), spread evenly, and the
// first key of plays, deliveries and report_state: a range of them is read
// through the primary index. The backfill and the audit split the ids into
// stateSlices ranges by their first two hex digits ("00" … "ff"): the
// first range starts at "" and the last one is open, so any id, hex or
// not, lies in exactly one.
const stateSlices = 256

// sliceRange is the condition of report ids from fine slice lo up to (not
// including) fine slice hi (0 ≤ lo < hi ≤ stateSlices).
func sliceRange(lo, hi int) string {
	var c []string
	if lo > 0 {
		c = append(c, fmt.Sprintf("report_id >= '%02x'", lo))
	}
	if hi < stateSlices {
		c = append(c, fmt.Sprintf("report_id < '%02x'", hi))
	}
	if len(c) == 0 {
		return "1 = 1"
	}
	return strings.Join(c, " AND ")
}

// BackfillBatchRows bounds the Delivery records one backfill batch reads
// (its slices are chosen from the table's size).
const BackfillBatchRows = 20_000_000

// backfill builds report_state from the deliveries already in the ledger:
// the fine slices not recorded in backfills yet, in batches of consecutive
// slices of about BackfillBatchRows records, each batch an INSERT … SELECT
// on the server and then the record of its slices. Interrupted, it resumes
// at the first slice not recorded; a batch run twice changes nothing (the
// states are idempotent). On a cluster it writes the connected replica's
// report_state_local (replicated) from the Distributed deliveries.
func backfill(ctx context.Context, conn driver.Conn, db, cluster string) error {
	return backfillBatches(ctx, conn, db, cluster, BackfillBatchRows, -1)
}

// backfillBatches is backfill with batches of about batchRows records, at
// most maxBatches of them (-1: all).
func backfillBatches(ctx context.Context, conn driver.Conn, db, cluster string, batchRows uint64, maxBatches int) error {
	done, err := backfilled(ctx, conn, db)
	if err != nil {
		return err
	}
	if allDone(done) {
		return nil
	}
	var total uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".deliveries").Scan(&total); err != nil {
		return fmt.Errorf("analytics: backfill %s: count deliveries: %w", TableReportState, err)
	}
	step := 1
	for step < stateSlices && total/uint64(stateSlices/step) < batchRows/2 {
		step *= 2
	}
	write := db + "." + TableReportState
	if cluster != "" {
		write += LocalSuffix
	}
	for lo := 0; lo < stateSlices && maxBatches != 0; {
		if done[lo] {
			lo++
			continue
		}
		hi := lo + 1
		for hi < stateSlices && hi-lo < step && !done[hi] {
			hi++
		}
		start := time.Now()
		if err := conn.Exec(ctx, "INSERT INTO "+write+" ("+reportStateColumnList()+") "+
			reportStateSelect(db+".deliveries", sliceRange(lo, hi))); err != nil {
			return fmt.Errorf("analytics: backfill %s, report ids %s: %w", TableReportState, sliceRange(lo, hi), err)
		}
		if err := recordSlices(ctx, conn, db, cluster, lo, hi); err != nil {
			return err
		}
		if step < stateSlices {
			slog.Info("ledger backfill", "table", TableReportState, "slices", fmt.Sprintf("%d-%d of %d", lo, hi-1, stateSlices), "took", time.Since(start).Round(time.Millisecond))
		}
		lo = hi
		maxBatches--
	}
	return nil
}

func allDone(done [stateSlices]bool) bool {
	for _, d := range done {
		if !d {
			return false
		}
	}
	return true
}

// recordSlices records fine slices [lo, hi) of report_state as backfilled.
func recordSlices(ctx context.Context, conn driver.Conn, db, cluster string, lo, hi int) error {
	table := db + "." + TableBackfills
	if cluster != "" {
		table += LocalSuffix
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+table+" (name, slice, done_at)")
	if err != nil {
		return fmt.Errorf("analytics: backfill %s: record progress: %w", TableReportState, err)
	}
	now := time.Now().Truncate(time.Second)
	for s := lo; s < hi; s++ {
		if err := b.Append(TableReportState, fmt.Sprintf("%02x", s), now); err != nil {
			_ = b.Abort()
			return fmt.Errorf("analytics: backfill %s: record progress: %w", TableReportState, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("analytics: backfill %s: record progress: %w", TableReportState, err)
	}
	return nil
}

// backfilled reads which fine slices of report_state are backfilled.
func backfilled(ctx context.Context, conn driver.Conn, db string) ([stateSlices]bool, error) {
	var done [stateSlices]bool
	rows, err := conn.Query(ctx, "SELECT DISTINCT slice FROM "+db+"."+TableBackfills+" WHERE name = '"+TableReportState+"'")
	if err != nil {
		return done, fmt.Errorf("analytics: read the backfill progress of %s: %w", TableReportState, err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return done, fmt.Errorf("analytics: read the backfill progress of %s: %w", TableReportState, err)
		}
		var n int
		if _, err := fmt.Sscanf(s, "%02x", &n); err == nil && n >= 0 && n < stateSlices {
			done[n] = true
		}
	}
	return done, rows.Err()
}

// readsSince is the oldest schema version the audit's queries read (the
// record identity of version 6).
const readsSince = 6

// schemaVersion is the ledger's schema version. Below readsSince (a
// migration under way: a sink starting on an old ledger) it waits up to
// Limits.MigrationWait for it, saying so on the progress writer, then
// returns an error that says in words why the audit cannot read the
// ledger; also when there is no ledger in the database.
func (a *Auditor) schemaVersion(ctx context.Context) (uint32, error) {
	deadline := time.Now().Add(a.limits.MigrationWait)
	said := false
	for {
		vs, err := AppliedVersions(ctx, a.conn, a.db)
		if err != nil && !errSchemaMissing(err) {
			return 0, fmt.Errorf("analytics: audit: %w", err)
		}
		var v uint32
		for _, x := range vs {
			v = max(v, x)
		}
		if v >= readsSince {
			return v, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return 0, fmt.Errorf("analytics: audit: no ledger in database %s (no %s table): is --clickhouse-db right, and has a sink or playpipe migrate run?", a.db, MigrationsTable)
			}
			return v, fmt.Errorf("analytics: audit: the ledger in %s is at schema version %d; the audit reads version %d or later (a migration under way, or a ledger never migrated): wait for it, or run playpipe migrate", a.db, v, readsSince)
		}
		if !said && a.limits.Progress != nil {
			fmt.Fprintf(a.limits.Progress, "playpipe audit: the ledger in %s is at schema version %d, below %d: waiting up to %s for its migration\n", a.db, v, readsSince, a.limits.MigrationWait)
			said = true
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, ctx.Err()
		case <-t.C:
		}
	}
}

// plan chooses how the audit reads the window's plays: nil for the exact
// path (Limits.Exact), else the slices (auditSliced), and the words of
// Audit.Path.
func (a *Auditor) plan(ctx context.Context, o AuditOptions) ([]slice, string, error) {
	if a.limits.Exact {
		return nil, "exact: the raw ledger in one pass (--exact)", nil
	}
	plan, err := a.planSlices(ctx, o)
	if err != nil {
		return nil, "", err
	}
	return plan, fmt.Sprintf("the raw ledger, %d slices of report ids, each grouped once", len(plan)), nil
}
