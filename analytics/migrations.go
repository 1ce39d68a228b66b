package analytics

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Migration is one versioned schema change. Statements use {db} for the
// database name. Every statement must be safe to run again (CREATE … IF NOT
// EXISTS, DROP TABLE IF EXISTS): a crash between a statement and the record
// of its version re-runs the migration.
//
// Portability: Statements are the portable DDL (SchemaPortable), which runs
// unchanged on ClickHouse 18.16 and on current releases, so: no DateTime64
// (DateTime plus an exact epoch-ms UInt64), no TTL, no JSON/Map/LowCardinality
// types, old-style-free MergeTree syntax (PARTITION BY / ORDER BY), and no
// `ADD COLUMN IF NOT EXISTS`. On a current server (SchemaCurrent) the same
// statements are rewritten by StatementsFor: see Schema.
type Migration struct {
	Version    uint32
	Name       string
	Statements []string
}

// Migrations is the schema of the ledger, in version order.
//
// Every ledger row carries the Kafka location of the record it came from
// (kafka_topic, kafka_partition, kafka_offset) and the record's timestamp
// (kafka_time DateTime for partitioning, kafka_time_ms UInt64 exact). The
// engines are ReplacingMergeTree with the location inside the sorting key,
// so a batch re-inserted after a sink crash converges to one row per Kafka
// record; the audit queries do not wait for that: they count distinct
// locations (see docs/audit.md, "Idempotency").
var Migrations = []Migration{
	{Version: 1, Name: "ledger tables", Statements: []string{
		// Raw player events, one row per record of <prefix>.events, valid or
		// not: raw holds the bytes verbatim; parsed = 1 when they are a JSON
		// object (the typed columns are then filled where present).
		ledgerTable("events", `
    kafka_key String,
    trace_id String,
    parsed UInt8,
    event_id String,
    mix_id Int64,
    started_at_ms Int64,
    offset_ms Int64,
    duration_ms Int64,
    user_id String,
    country String,
    raw String`,
			"kafka_time_ms, kafka_topic, kafka_partition, kafka_offset"),
		// Track plays derived by the consumer (<prefix>.reports): the columns
		// the audit and finance filter on; record holds the record's exact
		// bytes, the posted body included (visitParamExtract… reads the rest).
		ledgerTable("plays", `
    trace_id String,
    v Int32,
    report_id String,
    event_id String,
    mix_id Int64,
    position Int32,
    overlap_ms Int64,
    below_minimum UInt8,
    no_user_id UInt8,
    standby_listing UInt8,
    derived_at_ms Int64,
    track_id Int64,
    played_at_ms Int64,
    play_length Int64,
    user_id String,
    country String,
    isrc String,
    record String`,
			"report_id, kafka_topic, kafka_partition, kafka_offset"),
		// Answers of the partner API and final outcomes (<prefix>.deliveries).
		ledgerTable("deliveries", `
    v Int32,
    report_id String,
    event_id String,
    outcome String,
    attempt Int32,
    http_status Int32,
    served_by String,
    message String,
    fields Array(String),
    retry_reason String,
    latency_us Int64,
    trace_id String,
    replay UInt8,
    at_ms Int64`,
			"report_id, kafka_topic, kafka_partition, kafka_offset"),
		// Events that broke a rule (<prefix>.rejected); raw holds the event's
		// bytes (base64 decoded when the record carried them so), src_* the
		// event record's location.
		ledgerTable("rejections", `
    trace_id String,
    v Int32,
    event_id String,
    reason String,
    violation_reasons Array(String),
    violation_fields Array(String),
    violation_details Array(String),
    src_topic String,
    src_partition Int32,
    src_offset Int64,
    at_ms Int64,
    raw String`,
			"kafka_time_ms, kafka_topic, kafka_partition, kafka_offset"),
		// Records of the reports, deliveries and rejected topics that are not
		// the JSON their topic promises: kept with their bytes, never dropped.
		ledgerTable("malformed", `
    kafka_key String,
    error String,
    raw String`,
			"kafka_topic, kafka_partition, kafka_offset"),
	}},
	{Version: 2, Name: "deliveries.partner", Statements: []string{
		// The base URL of the partner API that answered (the reporter's
		// --api-url, or a built-in sandbox's loopback URL): the audit counts
		// deliveries per partner target and never counts a sandbox's answers
		// as real deliveries. '' for rows written before the column existed.
		`ALTER TABLE {db}.deliveries ADD COLUMN partner String DEFAULT ''`,
	}},
	{Version: 3, Name: "deliveries.in_doubt", Statements: []string{
		// 1 when an earlier post of the report may have reached the partner
		// without its answer being recorded (a reporter crash or an abandoned
		// post): the audit counts such a delivered play as possibly delivered
		// twice. 0 for rows written before the column existed.
		`ALTER TABLE {db}.deliveries ADD COLUMN in_doubt UInt8 DEFAULT 0`,
	}},
	{Version: 4, Name: "deliveries.replay_id", Statements: []string{
		// The operator's re-delivery (`playpipe replay` / `redrive`) that
		// sent the report, and its reason: the audit lists these answers per
		// replay and never counts them as delivered twice. '' for the live
		// reporter and for rows written before the columns existed.
		`ALTER TABLE {db}.deliveries ADD COLUMN replay_id String DEFAULT ''`,
		`ALTER TABLE {db}.deliveries ADD COLUMN replay_reason String DEFAULT ''`,
	}},
	{Version: 5, Name: "deliveries.doubt_cause", Statements: []string{
		// Why this attempt's fate at the partner is unknown (timeout,
		// connection_lost, malformed_answer, edge_answer), or the cause of an
		// earlier attempt that left no record (cancelled, crash): each row
		// with a cause is one copy the partner may hold beyond the recorded
		// deliveries, which the audit counts (docs/audit.md). '' for rows
		// written before the column existed (the audit then falls back to
		// in_doubt, one possible copy per play).
		`ALTER TABLE {db}.deliveries ADD COLUMN doubt_cause String DEFAULT ''`,
	}},
	{Version: 6, Name: "kafka_topic_id", Statements: append(topicIDStatements(),
		// The generation of the events topic a rejected event came from
		// (the sink's view of that topic's id when it copied the
		// rejection): with src_topic, src_partition and src_offset, the
		// rejected event's identity (docs/audit.md, "A record's identity").
		`ALTER TABLE {db}.rejections ADD COLUMN src_topic_id String DEFAULT '' AFTER src_offset`)},
	// Per-report state of the Delivery records, fed by a materialized view
	// as the sink inserted and backfilled from the ledger by the migration
	// run (state.go). Kept as recorded: migration 8 drops it.
	{Version: 7, Name: "report_state", Statements: reportStateStatements()},
	// The audit reads the raw ledger (cheaper than merging report_state's
	// states): the view, the state table and the backfill's progress go
	// (state.go; docs/audit.md, "The audit at scale").
	{Version: 8, Name: "drop report_state", Statements: dropReportStateStatements()},
	{Version: 9, Name: "plays.event_at_ms", Statements: []string{
		// The Kafka timestamp (epoch ms) of the event record the play was
		// derived from (TrackPlay.EventAt): the audit's delay starts there
		// without joining the events table. 0 for rows written before the
		// column existed or by a consumer that did not carry it (the audit
		// then looks the event up: docs/audit.md, "The delay").
		`ALTER TABLE {db}.plays ADD COLUMN event_at_ms UInt64 DEFAULT 0`,
	}},
}

// topicIDStatements add kafka_topic_id, the topic's id as the broker
// reports it (KIP-516; base64url, as kafka-topics.sh prints it), to every
// ledger table, and append it to the table's sorting key in the same
// ALTER. A Kafka location names a record only within one life of its
// topic: a topic deleted and created again (or a broker that came back
// empty) starts its offsets again at 0, so the record's identity is
// (kafka_topic_id, kafka_topic, kafka_partition, kafka_offset). In the
// sorting key of the ReplacingMergeTree, two records of two generations at
// one location are two rows, never merged into one. Rows written before the
// column existed, and rows from a broker that reports no topic ids, read
// the empty string (the unknown generation). ClickHouse can only add a
// column to the sorting key in the ALTER that adds it, and only without a
// DEFAULT expression: a String column's default is the empty string
// anyway. Runs on 18.16 and current releases alike, but for a replicated
// table on 18.16 (migrateLayout: withoutKeyChange).
func topicIDStatements() []string {
	keys := []struct{ table, orderBy string }{
		{"events", "kafka_time_ms, kafka_topic, kafka_partition, kafka_offset"},
		{"plays", "report_id, kafka_topic, kafka_partition, kafka_offset"},
		{"deliveries", "report_id, kafka_topic, kafka_partition, kafka_offset"},
		{"rejections", "kafka_time_ms, kafka_topic, kafka_partition, kafka_offset"},
		{"malformed", "kafka_topic, kafka_partition, kafka_offset"},
	}
	out := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		out = append(out, "ALTER TABLE {db}."+k.table+" ADD COLUMN kafka_topic_id String AFTER kafka_offset, MODIFY ORDER BY ("+k.orderBy+", kafka_topic_id)")
	}
	return out
}

// ledgerTable is the portable DDL of the ledger table name: the Kafka
// location and time columns every row carries, then cols (the table's own
// columns as DDL, each line starting with a newline and four spaces, comma
// separated), in a ReplacingMergeTree partitioned by month of kafka_time and
// sorted by orderBy.
func ledgerTable(name, cols, orderBy string) string {
	return "CREATE TABLE IF NOT EXISTS {db}." + name + ` (
    kafka_topic String,
    kafka_partition Int32,
    kafka_offset Int64,
    kafka_time DateTime,
    kafka_time_ms UInt64,
    inserted_at DateTime DEFAULT now(),` + cols + `
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_time)
ORDER BY (` + orderBy + ")"
}

// Schema is the DDL dialect the migrations are written in, chosen once per
// Migrate from the server's version() (SchemaForVersion). Both give the same
// tables, columns, engines and sorting keys, and the audit's queries the same
// answers (docs/audit.md, "Two schema paths"); they differ only in the
// storage type of the low-cardinality columns.
type Schema int

const (
	// SchemaPortable is the DDL as written in Migrations: it runs on every
	// server from 18.16 (Debian's, which every local test uses) on.
	SchemaPortable Schema = iota
	// SchemaCurrent stores the columns of LowCardinalityColumns as
	// LowCardinality(String) (dictionary-encoded: smaller on disk, faster to
	// filter and group by). Chosen from CurrentSchemaSince on.
	SchemaCurrent
)

func (s Schema) String() string {
	switch s {
	case SchemaPortable:
		return "portable"
	case SchemaCurrent:
		return "current"
	}
	return "Schema(" + strconv.Itoa(int(s)) + ")"
}

// CurrentSchemaSince is the oldest server version (major, minor) given
// SchemaCurrent: 21.8, a conservative choice, a long-term-support release on
// which LowCardinality is long a regular type (18.16 has it only behind
// allow_experimental_low_cardinality_type). The docker suite runs it on the
// version docker-compose.yml uses.
var CurrentSchemaSince = [2]int{21, 8}

// LowCardinalityColumns are the String columns stored as
// LowCardinality(String) by SchemaCurrent, per table: values from a small,
// closed set (topic names, outcomes, the answering service, partner base
// URLs, reasons, ISO country codes). Columns of free text or ids (message,
// error, trace_id, report_id, isrc, raw, record) stay String.
var LowCardinalityColumns = map[string][]string{
	"events":     {"kafka_topic", "country"},
	"plays":      {"kafka_topic", "country"},
	"deliveries": {"kafka_topic", "outcome", "served_by", "retry_reason", "partner"},
	"rejections": {"kafka_topic", "reason", "src_topic"},
	"malformed":  {"kafka_topic"},
}

// versionRE reads the major and minor numbers of a version() string such as
// "18.16.1" or "25.8.2.29" (a suffix such as "-lts" is ignored).
var versionRE = regexp.MustCompile(`^\s*v?(\d+)\.(\d+)`)

// SchemaForVersion returns the schema for a server whose SELECT version()
// answered v: SchemaCurrent from CurrentSchemaSince on, else SchemaPortable.
// A version it cannot read gets SchemaPortable, which runs everywhere.
func SchemaForVersion(v string) Schema {
	m := versionRE.FindStringSubmatch(v)
	if m == nil {
		return SchemaPortable
	}
	major, err1 := strconv.Atoi(m[1])
	minor, err2 := strconv.Atoi(m[2])
	if err1 != nil || err2 != nil {
		return SchemaPortable
	}
	if major > CurrentSchemaSince[0] || major == CurrentSchemaSince[0] && minor >= CurrentSchemaSince[1] {
		return SchemaCurrent
	}
	return SchemaPortable
}

// ServerSchema asks the server its version (SELECT version()) and returns it
// with the schema Migrate uses there.
func ServerSchema(ctx context.Context, conn driver.Conn) (Schema, string, error) {
	var v string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&v); err != nil {
		return SchemaPortable, "", fmt.Errorf("analytics: migrate: read the server version: %w", err)
	}
	return SchemaForVersion(v), v, nil
}

// tableOfRE finds the table a migration statement creates or alters.
var tableOfRE = regexp.MustCompile(`^(?:CREATE TABLE IF NOT EXISTS|ALTER TABLE) \{db\}\.([A-Za-z_][A-Za-z0-9_]*)`)

// lowCardinalityRE matches the definition of column c as a String, in a
// CREATE TABLE (one column a line, four spaces in) or an ADD COLUMN.
func lowCardinalityRE(c string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)((?:^    |ADD COLUMN )` + regexp.QuoteMeta(c) + `) String\b`)
}

// StatementsFor returns the migration's statements in schema s: the portable
// ones as written, or for SchemaCurrent with each column of
// LowCardinalityColumns defined as LowCardinality(String). Nothing else
// differs (TestCurrentSchemaGolden).
func (m Migration) StatementsFor(s Schema) []string {
	out := append([]string(nil), m.Statements...)
	if s != SchemaCurrent {
		return out
	}
	for i, st := range out {
		tm := tableOfRE.FindStringSubmatch(st)
		if tm == nil {
			continue
		}
		for _, c := range LowCardinalityColumns[tm[1]] {
			out[i] = lowCardinalityRE(c).ReplaceAllString(out[i], "${1} LowCardinality(String)")
		}
	}
	return out
}

// addColumnRE matches the one ALTER form the migrations use. 18.16 has no
// ADD COLUMN IF NOT EXISTS, so migrate skips such a statement when the column
// is already there (a crash between the ALTER and the record of its version).
// On a cluster the statement names the cluster (clusterStatements).
var addColumnRE = regexp.MustCompile(`^ALTER TABLE \{db\}\.([A-Za-z_][A-Za-z0-9_]*)(?: ON CLUSTER [A-Za-z0-9_]+)? ADD COLUMN ([A-Za-z_][A-Za-z0-9_]*) `)

// MigrationsTable records the applied versions.
const MigrationsTable = "schema_migrations"

// Migrate creates the database when missing and applies the migrations not
// yet recorded in {db}.schema_migrations, in version order. It returns the
// versions it applied (none when the schema is current). Running it twice, or
// from two processes at once, is safe.
//
// The DDL is chosen once from the server's version when a migration is
// pending (ServerSchema): SchemaCurrent on a current server, SchemaPortable
// elsewhere. A ledger keeps the types it was created with: a portable ledger
// on an upgraded server stays portable (docs/audit.md, "Two schema paths").
func Migrate(ctx context.Context, conn driver.Conn, db string) ([]uint32, error) {
	return migrate(ctx, conn, db, Migrations)
}

// MigrateWith is Migrate in a given schema instead of the server's (for
// example SchemaPortable for a ledger to be copied to an older server). On a
// server older than CurrentSchemaSince, SchemaCurrent fails unless the
// context carries allow_experimental_low_cardinality_type = 1.
//
// No command calls it (deadcode lists it): the schema tests of analytics and
// of the docker suite (e2e/docker, another package, so it cannot live in a
// test file) build ledgers of a chosen schema with it.
func MigrateWith(ctx context.Context, conn driver.Conn, db string, s Schema) ([]uint32, error) {
	return migrateLayout(ctx, conn, db, "", Migrations, &s)
}

func migrate(ctx context.Context, conn driver.Conn, db string, list []Migration) ([]uint32, error) {
	return migrateLayout(ctx, conn, db, "", list, nil)
}

// migrateLayout applies list in schema *s, or when s is nil in the server's
// (asked only when a migration is pending), on one server (cluster "") or
// ON CLUSTER cluster (see MigrateCluster).
func migrateLayout(ctx context.Context, conn driver.Conn, db, cluster string, list []Migration, s *Schema) ([]uint32, error) {
	if !identRE.MatchString(db) {
		return nil, fmt.Errorf("analytics: migrate: database %q is not an identifier", db)
	}
	if cluster != "" && !identRE.MatchString(cluster) {
		return nil, fmt.Errorf("analytics: migrate: cluster %q is not an identifier", cluster)
	}
	if err := checkLayout(ctx, conn, db, cluster, list); err != nil {
		return nil, err
	}
	applied, err := migrationsTable(ctx, conn, db, cluster)
	if err != nil {
		return nil, err
	}
	done := make(map[uint32]bool, len(applied))
	for _, v := range applied {
		done[v] = true
	}
	sorted := append([]Migration(nil), list...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Version < sorted[j].Version })
	var out []uint32
	for _, m := range sorted {
		if done[m.Version] {
			continue
		}
		if s == nil {
			schema, _, err := ServerSchema(ctx, conn)
			if err != nil {
				return out, err
			}
			s = &schema
		}
		sts, err := m.clusterStatementsFor(*s, db, cluster)
		if err != nil {
			return out, err
		}
		for i, st := range sts {
			if sm := addColumnRE.FindStringSubmatch(st); sm != nil {
				has, err := hasColumn(ctx, conn, db, sm[1], sm[2])
				if err != nil {
					return out, fmt.Errorf("analytics: migration %d (%s), statement %d: %w", m.Version, m.Name, i+1, err)
				}
				if has {
					continue
				}
			}
			err := conn.Exec(ctx, strings.ReplaceAll(st, "{db}", db))
			if add, ok := withoutKeyChange(st); ok && errNotImplemented(err) {
				// A replicated table on ClickHouse 18.16 cannot change its
				// sorting key (code 48, "Unsupported type of ALTER query"):
				// the column is added outside it (docs/audit.md, "A
				// record's identity": the limit of such a ledger).
				err = conn.Exec(ctx, strings.ReplaceAll(add, "{db}", db))
			}
			if err != nil {
				return out, fmt.Errorf("analytics: migration %d (%s), statement %d: %w", m.Version, m.Name, i+1, err)
			}
		}
		if err := recordMigration(ctx, conn, db, m); err != nil {
			return out, fmt.Errorf("analytics: record migration %d: %w", m.Version, err)
		}
		out = append(out, m.Version)
	}
	if cluster != "" {
		if err := syncDistributed(ctx, conn, db, cluster, list); err != nil {
			return out, err
		}
	}
	return out, nil
}

// migrationsTable creates the database and {db}.schema_migrations when
// missing and returns the versions recorded there. On a cluster both are
// created ON CLUSTER (the table replicated), and only when the table is
// missing: an ON CLUSTER statement waits for every host, so a sink started
// while a replica is down must not run one for a ledger that exists.
func migrationsTable(ctx context.Context, conn driver.Conn, db, cluster string) ([]uint32, error) {
	if cluster != "" {
		applied, err := AppliedVersions(ctx, conn, db)
		if err == nil || !errSchemaMissing(err) {
			return applied, err
		}
	}
	on, engine := "", "ReplacingMergeTree"
	if cluster != "" {
		on = " ON CLUSTER " + cluster
		engine = "ReplicatedReplacingMergeTree('" + ZooKeeperPath(db, MigrationsTable) + "', '{replica}')"
	}
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+db+on); err != nil {
		return nil, fmt.Errorf("analytics: migrate: create database %s%s: %w", db, on, err)
	}
	if err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+db+`.`+MigrationsTable+on+` (
    version UInt32,
    name String,
    applied_at DateTime
) ENGINE = `+engine+` ORDER BY version`); err != nil {
		return nil, fmt.Errorf("analytics: migrate: create %s.%s%s: %w", db, MigrationsTable, on, err)
	}
	return AppliedVersions(ctx, conn, db)
}

// hasColumn reports whether db.table has the column (system.columns).
func hasColumn(ctx context.Context, conn driver.Conn, db, table, column string) (bool, error) {
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = '"+db+"' AND table = '"+table+"' AND name = '"+column+"'").Scan(&n); err != nil {
		return false, fmt.Errorf("look up column %s.%s.%s: %w", db, table, column, err)
	}
	return n > 0, nil
}

// recordMigration inserts the version row. Inserts go through a prepared
// batch: 18.16 does not accept an INSERT … VALUES sent as a plain query by
// the native protocol client.
func recordMigration(ctx context.Context, conn driver.Conn, db string, m Migration) error {
	b, err := conn.PrepareBatch(ctx, `INSERT INTO `+db+`.`+MigrationsTable+` (version, name, applied_at)`)
	if err != nil {
		return err
	}
	if err := b.Append(m.Version, m.Name, time.Now().Truncate(time.Second)); err != nil {
		_ = b.Abort()
		return err
	}
	return b.Send()
}

// AppliedVersions returns the versions recorded in {db}.schema_migrations, ascending.
func AppliedVersions(ctx context.Context, conn driver.Conn, db string) ([]uint32, error) {
	rows, err := conn.Query(ctx, `SELECT DISTINCT version FROM `+db+`.`+MigrationsTable+` ORDER BY version`)
	if err != nil {
		return nil, fmt.Errorf("analytics: read %s.%s: %w", db, MigrationsTable, err)
	}
	defer rows.Close()
	var out []uint32
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("analytics: read %s.%s: %w", db, MigrationsTable, err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// LatestVersion is the version the migrations bring the schema to.
func LatestVersion() uint32 {
	var v uint32
	for _, m := range Migrations {
		v = max(v, m.Version)
	}
	return v
}

// modifyOrderBy is the sorting key change a migration's ADD COLUMN may carry.
const modifyOrderBy = ", MODIFY ORDER BY ("

// withoutKeyChange returns the ADD COLUMN statement st without its
// MODIFY ORDER BY, and whether it had one.
func withoutKeyChange(st string) (string, bool) {
	i := strings.Index(st, modifyOrderBy)
	if i < 0 || addColumnRE.FindStringSubmatch(st) == nil {
		return st, false
	}
	return st[:i], true
}

// errNotImplemented tells whether err is ClickHouse's NOT_IMPLEMENTED (48),
// which 18.16 answers to MODIFY ORDER BY on a replicated table.
func errNotImplemented(err error) bool {
	var ex *clickhouse.Exception
	return errors.As(err, &ex) && ex.Code == 48
}

// errSchemaMissing tells whether err says a table or database is missing
// (ClickHouse exception codes 60 UNKNOWN_TABLE and 81 UNKNOWN_DATABASE):
// the sink then re-applies the migrations (a server whose data was wiped).
func errSchemaMissing(err error) bool {
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		return ex.Code == 60 || ex.Code == 81
	}
	return false
}
