package analytics

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/playpipe/playpipe/schemas"
)

// Per-report state (docs/audit.md, "The audit at scale"): tried and
// dropped.
//
// Migration 7 made report_state, per report id the outcome states of its
// Delivery records, kept up to date by the materialized view
// report_state_mv from every insert into deliveries, and a table of the
// progress of its backfill from an existing ledger (backfills). The audit
// read it until measured: merging its uniqExact states cost more than
// grouping the raw records with cheap states (audit_sliced.go), so the
// audit reads the raw ledger, and migration 8 drops the view and both
// tables (the view cost an insert per sink batch, the backfill a pass over
// the ledger at every migration run). Migration 7 stays as written: a
// ledger may have it recorded, and a new ledger runs 7 then 8.

// TableReportState and TableBackfills are the per-report state and the
// record of its backfill's progress; reportStateView fed the first.
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
// 64-bit hash does not collide). The audit's slices count by it too.
const reportLoc = "cityHash64(kafka_topic_id, toString(kafka_topic), kafka_partition, kafka_offset)"

// reportStateColumns are report_state's state columns (named name_s):
// name, type, and the -State expression over a deliveries row that fed it.
var reportStateColumns = []struct{ name, typ, state string }{
	{"delivered_n", "AggregateFunction(uniqExactIf, UInt64, UInt8)", "uniqExactIfState(" + reportLoc + ", outcome = 'delivered' AND replay_id = '')"},
	{"replay_delivered_n", "AggregateFunction(uniqExactIf, UInt64, UInt8)", "uniqExactIfState(" + reportLoc + ", outcome = 'delivered' AND replay_id != '')"},
	{"rejected_n", "AggregateFunction(max, UInt8)", "maxState(toUInt8(outcome = 'rejected'))"},
	{"standby_n", "AggregateFunction(max, UInt8)", "maxState(toUInt8(outcome = 'standby'))"},
	{"parked_n", "AggregateFunction(max, UInt8)", "maxState(toUInt8(outcome = '" + schemas.OutcomeParked + "'))"},
	{"doubt_delivered", "AggregateFunction(maxIf, UInt8, UInt8)", "maxIfState(in_doubt, outcome = 'delivered' AND replay_id = '')"},
	{"doubt_n", "AggregateFunction(uniqExactIf, UInt64, UInt8)", "uniqExactIfState(" + reportLoc + ", doubt_cause != '' AND replay_id = '')"},
	{"replay_doubt_n", "AggregateFunction(uniqExactIf, UInt64, UInt8)", "uniqExactIfState(" + reportLoc + ", doubt_cause != '' AND replay_id != '')"},
	{"delivered_ms", "AggregateFunction(minIf, Int64, UInt8)", "minIfState(at_ms, outcome = 'delivered')"},
	{"replayed", "AggregateFunction(max, UInt8)", "maxState(toUInt8(replay_id != ''))"},
	{"reject_message", "AggregateFunction(anyIf, String, UInt8)", "anyIfState(message, outcome = 'rejected')"},
}

// reportStateTable is migration 7's report_state DDL (a ledger CREATE: on a
// cluster a replicated report_state_local and a Distributed report_state).
func reportStateTable() string {
	cols := []string{"    report_id String"}
	for _, c := range reportStateColumns {
		cols = append(cols, "    "+c.name+stateSuffix+" "+c.typ)
	}
	return "CREATE TABLE IF NOT EXISTS {db}." + TableReportState + " (\n" + strings.Join(cols, ",\n") + "\n) ENGINE = AggregatingMergeTree\nORDER BY report_id"
}

// reportStateSelect is the SELECT of report_state's rows from the deliveries
// table from (qualified).
func reportStateSelect(from string) string {
	exprs := []string{"report_id"}
	for _, c := range reportStateColumns {
		exprs = append(exprs, c.state+" AS "+c.name+stateSuffix)
	}
	return "SELECT " + strings.Join(exprs, ", ") + " FROM " + from + " GROUP BY report_id"
}

// reportStateStatements are migration 7's statements: the state table, the
// table of backfill progress, and the view that fed the state from every
// insert into deliveries.
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
			reportStateSelect("{db}.deliveries"),
	}
}

// dropReportStateStatements are migration 8's statements: the view first
// (it writes into report_state), then both tables. DROP TABLE drops a view
// too, on 18.16 (which has no DROP VIEW) and current releases.
func dropReportStateStatements() []string {
	return []string{
		"DROP TABLE IF EXISTS {db}." + reportStateView,
		"DROP TABLE IF EXISTS {db}." + TableReportState,
		"DROP TABLE IF EXISTS {db}." + TableBackfills,
	}
}

// viewClusterStatement is the cluster form of migration 7's view: on every
// replica, from its deliveries_local into its report_state_local (a
// replica's view saw the inserts made on that replica; the state table
// replicated what it wrote).
func viewClusterStatement(st, cluster string) (string, bool) {
	prefix := "CREATE MATERIALIZED VIEW IF NOT EXISTS {db}." + reportStateView + " TO {db}." + TableReportState + " AS "
	if !strings.HasPrefix(st, prefix) {
		return "", false
	}
	return "CREATE MATERIALIZED VIEW IF NOT EXISTS {db}." + reportStateView + " ON CLUSTER " + cluster +
		" TO {db}." + TableReportState + LocalSuffix + " AS " + reportStateSelect("{db}.deliveries"+LocalSuffix), true
}

// Report ids are 32 hex digits (schemas.ReportID), spread evenly, and the
// first key of plays and deliveries: a range of them is read through the
// primary index. The audit splits the ids into stateSlices ranges by their
// first two hex digits ("00" … "ff"): the first range starts at "" and the
// last one is open, so any id, hex or not, lies in exactly one.
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

// readsSince is the oldest schema version the audit's queries read (the
// record identity of version 6, the carried event record time of version 9).
const readsSince = 9

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
