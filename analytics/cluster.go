package analytics

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The ledger's table names, in one place, for both layouts (docs/audit.md,
// "A replicated ledger"):
//
//   - One server (Config.Cluster empty, the default): db.<table> is a
//     ReplacingMergeTree; the sink writes it and the queries read it.
//   - A cluster (Config.Cluster names an entry of the servers'
//     remote_servers): db.<table>_local is a ReplicatedReplacingMergeTree on
//     every replica, which the sink writes on whichever replica it reached;
//     db.<table> is a Distributed table over the <table>_local tables, which
//     every read goes through (the audit, its lists and HTML page, the
//     replay selection, the dashboards).
//
// The read name is the same on both layouts, db.<table>, so the query
// files (the audit, replay, the Grafana panels) run unchanged on a
// cluster; only the sink's inserts (Config.WriteTable) and the DDL
// (clusterStatements) differ. The decision keeps every query portable and
// lets a dashboard written for one server read a cluster's whole ledger.

// LocalSuffix ends the names of a cluster ledger's replicated tables.
const LocalSuffix = "_local"

// WriteTable is the qualified table the sink inserts into: db.name on one
// server, db.name_local (the reached replica's replicated table) on a
// cluster.
func (c Config) WriteTable(name string) string {
	c = c.withDefaults()
	if c.Cluster != "" {
		return c.Database + "." + name + LocalSuffix
	}
	return c.Database + "." + name
}

// insertContext carries the settings of the sink's inserts: on a cluster
// insert_deduplicate = 1 (the default of every release, set explicitly so
// that a user profile cannot turn it off), which makes a replicated table
// drop a block identical to one it already holds (docs/audit.md,
// "Idempotency on a cluster"). A setting 18.16 knows; one server: ctx.
func (c Config) insertContext(ctx context.Context) context.Context {
	if c.Cluster == "" {
		return ctx
	}
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_deduplicate": 1}))
}

// Migrate applies the ledger's migrations in the layout of c: Migrate on one
// server, MigrateCluster when c.Cluster is set.
func (c Config) Migrate(ctx context.Context, conn driver.Conn) ([]uint32, error) {
	c = c.withDefaults()
	return MigrateCluster(ctx, conn, c.Database, c.Cluster)
}

// MigrateCluster is Migrate for the ledger of cluster (Migrate itself when
// cluster is ""): the database and tables are created ON CLUSTER, each
// table as <table>_local with the Replicated form of its engine under the
// ZooKeeper path ZooKeeperPath (the servers' {shard} and {replica} macros),
// plus a Distributed table <table> over them for reads, made (again) once
// the run's migrations are applied (syncDistributed). The cluster must be
// one shard (any number of replicas): the audit joins a report's plays and
// deliveries, which one shard keeps together. When nothing is pending and
// the Distributed tables are in step it runs no DDL, so it returns at once
// while a replica is down (an ON CLUSTER statement waits for every host,
// up to the servers' distributed_ddl_task_timeout).
//
// Both forms check the ledger's layout first: a ledger created for one
// server is refused on a cluster and the other way round, with an error
// naming --clickhouse-cluster.
func MigrateCluster(ctx context.Context, conn driver.Conn, db, cluster string) ([]uint32, error) {
	return migrateLayout(ctx, conn, db, cluster, Migrations, nil)
}

// ZooKeeperPath is the ZooKeeper path of a cluster ledger's replicated table:
// one per shard ({shard} macro) and table; each replica registers under it
// by its {replica} macro. Both macros must be set in every server's
// <macros> section.
func ZooKeeperPath(db, table string) string {
	return "/clickhouse/tables/{shard}/" + db + "/" + table
}

// createTableRE splits a ledger CREATE statement: the table name, the
// column list, the engine's name and parameters, and the rest (PARTITION
// BY / ORDER BY).
var createTableRE = regexp.MustCompile(`(?s)^CREATE TABLE IF NOT EXISTS \{db\}\.([A-Za-z_][A-Za-z0-9_]*) (\(.*\)) ENGINE = ([A-Za-z]*MergeTree)(?:\(([^)]*)\))?(.*)$`)

// dropTableRE matches a migration's DROP of a table or view.
var dropTableRE = regexp.MustCompile(`^DROP TABLE IF EXISTS \{db\}\.([A-Za-z_][A-Za-z0-9_]*)$`)

// clusterStatements rewrites one migration statement (a CREATE TABLE, an
// ALTER TABLE … ADD COLUMN or a DROP TABLE of the ledger, {db} still
// unexpanded) for the ledger of cluster on database db: a CREATE gives the
// replicated <table>_local ON CLUSTER, an ADD COLUMN alters it (on one
// replica: the ALTER of a replicated table is replicated), a DROP drops the
// Distributed <table> and <table>_local ON CLUSTER (a view: itself). The
// Distributed tables over them are made by syncDistributed once the
// migrations are applied, not after each statement: every ON CLUSTER
// statement waits on both replicas' distributed DDL queues (about 110 ms
// idle on 18.16). A fresh ledger took 45 ON CLUSTER statements and 9–13 s
// on an idle 2-core machine; it took 12 and 11 plain ALTERs, 1.6 s, before
// migrations 7 and 8 (report_state made and dropped: 8 more).
// Any other form is an error: a migration must say how it runs on a
// cluster rather than be guessed.
func clusterStatements(st, db, cluster string) ([]string, error) {
	on := " ON CLUSTER " + cluster
	if m := createTableRE.FindStringSubmatch(st); m != nil {
		name, cols, engine, params, rest := m[1], m[2], m[3], m[4], m[5]
		args := "'" + ZooKeeperPath(db, name) + "', '{replica}'"
		if strings.TrimSpace(params) != "" {
			args += ", " + params
		}
		return []string{"CREATE TABLE IF NOT EXISTS {db}." + name + LocalSuffix + on + " " + cols +
			" ENGINE = Replicated" + engine + "(" + args + ")" + rest}, nil
	}
	if m := addColumnRE.FindStringSubmatch(st); m != nil {
		// Not ON CLUSTER: an ALTER of a replicated table is replicated
		// through ZooKeeper to every replica (and waits for the active
		// ones), so it runs on the server of the connection alone. ON
		// CLUSTER, 18.16's DDL workers run it once per shard under a
		// ZooKeeper lock, and a replica that takes the lock just after the
		// other released it runs it again and dies on "Node exists"
		// (…/shards/…/executed, "DDLWorker: Unexpected ZooKeeper error …
		// Terminating."): every later ON CLUSTER statement then waited
		// distributed_ddl_task_timeout (180 s) for it. Seen twice in CI.
		prefix := "ALTER TABLE {db}." + m[1]
		return []string{prefix + LocalSuffix + strings.TrimPrefix(st, prefix)}, nil
	}
	if v, ok := viewClusterStatement(st, cluster); ok {
		return []string{v}, nil
	}
	if m := dropTableRE.FindStringSubmatch(st); m != nil {
		// ON CLUSTER: every replica has its own view, Distributed table
		// and replicated table (a replica's DROP of a replicated table
		// leaves the others' copies). A view has no _local form; a ledger
		// table's Distributed table goes first, then the replicated one.
		drop := "DROP TABLE IF EXISTS {db}." + m[1]
		if m[1] == reportStateView {
			return []string{drop + on}, nil
		}
		return []string{drop + on, drop + LocalSuffix + on}, nil
	}
	return nil, fmt.Errorf("analytics: migrate --clickhouse-cluster: no cluster form for the statement %.60q…", st)
}

// distributedTable is the DDL of the Distributed table name over the
// replicated name_local tables of cluster.
func distributedTable(name, db, cluster string) string {
	return "CREATE TABLE IF NOT EXISTS {db}." + name + " ON CLUSTER " + cluster + " AS {db}." + name + LocalSuffix +
		" ENGINE = Distributed(" + cluster + ", " + db + ", " + name + LocalSuffix + ")"
}

// syncDistributed makes the Distributed table of every ledger table whose
// replicated <table>_local exists, where the Distributed one is missing or
// its columns (names and types, on the server of conn) differ from the
// local table's. 18.16 refuses an ALTER ON CLUSTER of a table that is not
// replicated on a cluster whose shards are ("Table … isn't replicated, but
// shard #1 is replicated according to its cluster definition"), so a
// Distributed table, which holds no data (the sink never inserts through
// it), is dropped and made again. Reads of that table fail for the moment
// between, and reads of a new column until the migration run ends.
//
// It runs at the end of every cluster migration, also when nothing was
// pending: a run interrupted after recording a migration but before its
// Distributed tables were made is repaired by the next one. When every
// table is in step it runs no DDL.
func syncDistributed(ctx context.Context, conn driver.Conn, db, cluster string, list []Migration) error {
	names := ledgerTableNames(list)
	cols, err := tableColumns(ctx, conn, db)
	if err != nil {
		return err
	}
	for _, name := range names {
		local, ok := cols[name+LocalSuffix]
		if !ok {
			continue
		}
		dist, ok := cols[name]
		if ok && slices.Equal(dist, local) {
			continue
		}
		if ok {
			if err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+db+"."+name+" ON CLUSTER "+cluster); err != nil {
				return fmt.Errorf("analytics: migrate: drop the Distributed table %s.%s to make it again over %s%s: %w", db, name, name, LocalSuffix, err)
			}
		}
		if err := conn.Exec(ctx, strings.ReplaceAll(distributedTable(name, db, cluster), "{db}", db)); err != nil {
			return fmt.Errorf("analytics: migrate: make the Distributed table %s.%s: %w", db, name, err)
		}
	}
	return nil
}

// tableColumns reads the columns of every table of db on the server of
// conn, each table's as sorted "name type" strings.
func tableColumns(ctx context.Context, conn driver.Conn, db string) (map[string][]string, error) {
	rows, err := conn.Query(ctx, "SELECT table, name, type FROM system.columns WHERE database = "+quoteSQL(db))
	if err != nil {
		return nil, fmt.Errorf("analytics: migrate: read system.columns: %w", err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var table, name, typ string
		if err := rows.Scan(&table, &name, &typ); err != nil {
			return nil, fmt.Errorf("analytics: migrate: read system.columns: %w", err)
		}
		out[table] = append(out[table], name+" "+typ)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("analytics: migrate: read system.columns: %w", err)
	}
	for _, c := range out {
		slices.Sort(c)
	}
	return out, nil
}

// clusterStatementsFor is m.StatementsFor(s) in the layout of cluster (the
// statements themselves when cluster is "").
func (m Migration) clusterStatementsFor(s Schema, db, cluster string) ([]string, error) {
	sts := m.StatementsFor(s)
	if cluster == "" {
		return sts, nil
	}
	var out []string
	for _, st := range sts {
		cs, err := clusterStatements(st, db, cluster)
		if err != nil {
			return nil, fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
		out = append(out, cs...)
	}
	return out, nil
}

// ledgerTableNames are the tables the migrations create and no later one
// drops, in order.
func ledgerTableNames(list []Migration) []string {
	var out []string
	for _, m := range list {
		for _, st := range m.Statements {
			if cm := createTableRE.FindStringSubmatch(st); cm != nil {
				out = append(out, cm[1])
			}
			if dm := dropTableRE.FindStringSubmatch(st); dm != nil {
				out = slices.DeleteFunc(out, func(t string) bool { return t == dm[1] })
			}
		}
	}
	return out
}

// checkLayout refuses a database whose ledger tables are of the other
// layout than cluster asks (see MigrateCluster), and on a cluster a
// cluster name the server does not know or one of more than one shard.
func checkLayout(ctx context.Context, conn driver.Conn, db, cluster string, list []Migration) error {
	if cluster != "" {
		var shards, replicas uint64
		if err := conn.QueryRow(ctx, "SELECT uniqExact(shard_num), count() FROM system.clusters WHERE cluster = "+quoteSQL(cluster)).Scan(&shards, &replicas); err != nil {
			return fmt.Errorf("analytics: migrate: read system.clusters: %w", err)
		}
		switch {
		case shards == 0:
			return fmt.Errorf("analytics: --clickhouse-cluster %s: the server has no such cluster (system.clusters; <remote_servers> in its configuration)", cluster)
		case shards > 1:
			return fmt.Errorf("analytics: --clickhouse-cluster %s has %d shards: the ledger runs on one shard with any number of replicas (the audit joins a report's plays and deliveries, which one shard keeps together; docs/audit.md)", cluster, shards)
		}
	}
	rows, err := conn.Query(ctx, "SELECT name, engine FROM system.tables WHERE database = "+quoteSQL(db))
	if err != nil {
		return fmt.Errorf("analytics: migrate: read system.tables: %w", err)
	}
	defer rows.Close()
	engines := map[string]string{}
	for rows.Next() {
		var name, engine string
		if err := rows.Scan(&name, &engine); err != nil {
			return fmt.Errorf("analytics: migrate: read system.tables: %w", err)
		}
		engines[name] = engine
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("analytics: migrate: read system.tables: %w", err)
	}
	for _, t := range ledgerTableNames(list) {
		e, ok := engines[t]
		switch {
		case cluster == "" && ok && e == "Distributed":
			return fmt.Errorf("analytics: %s.%s is a Distributed table: this ledger was made for a cluster; pass its name with --clickhouse-cluster", db, t)
		case cluster != "" && ok && e != "Distributed":
			return fmt.Errorf("analytics: %s.%s is a %s table, made for one server, not a cluster ledger: use a new database for --clickhouse-cluster %s (docs/audit.md, \"A replicated ledger\")", db, t, e, cluster)
		case cluster != "" && engines[t+LocalSuffix] != "" && !strings.HasPrefix(engines[t+LocalSuffix], "Replicated"):
			return fmt.Errorf("analytics: %s.%s%s is a %s table, not a replicated one: not a cluster ledger", db, t, LocalSuffix, engines[t+LocalSuffix])
		}
	}
	return nil
}
